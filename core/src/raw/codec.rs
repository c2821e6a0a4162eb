//! [`Codec`]: how one column packs a row's values into its words, per
//! [`Dtype`].
//!
//! - `F32`: two values per word, the [`kernels`](super::kernels) layout.
//! - `F16` and `Bf16`: four values per word, value `4i + j` in bits
//!   `16j..16j + 16` of word `i`; the padding of a last, partial word is
//!   written as the encoded initial value (so as 0 bits).
//!
//! A codec may XOR-encode every value with the bits of an initial value (a
//! slot column's, see [`rows`](super::rows)): zeroed words then read as
//! that value. Half-precision values are converted through small stack
//! buffers with `half`'s slice conversions; rounding is to nearest even
//! except in [`Codec::store_stochastic`]. Rows are written with
//! [`store_words`] and copied out with [`load_words`] (accesses that behave
//! as Relaxed atomic word accesses, as in the kernels); the caller's seqlock
//! orders them.

use super::bulk::{load_words, store_words};
use super::kernels::{
    add_row_if_finite, load_row_xor, store_row, store_row_xor, words_for_dim, xor_mask,
};
use crate::Dtype;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use std::sync::atomic::AtomicU64;

/// Values converted per step through the stack buffers.
const CHUNK: usize = 64;
/// Half-precision values per word.
const HALVES: usize = 4;

/// How a column stores its values (module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Codec {
    dtype: Dtype,
    /// XOR mask of one word: the initial value's bits in every lane.
    mask: u64,
    /// The initial value, rounded to the dtype.
    initial: f32,
}

impl Codec {
    /// A codec storing `dtype`, XOR-encoded with `initial` (rounded to
    /// `dtype`; `0.0` for no encoding).
    pub(crate) fn new(dtype: Dtype, initial: f32) -> Codec {
        let initial = dtype.round(initial);
        let mask = match dtype {
            Dtype::F32 => xor_mask(initial),
            Dtype::F16 => u64::from(f16::from_f32(initial).to_bits()) * 0x0001_0001_0001_0001,
            Dtype::Bf16 => u64::from(bf16::from_f32(initial).to_bits()) * 0x0001_0001_0001_0001,
        };
        Codec {
            dtype,
            mask,
            initial,
        }
    }

    /// The initial value, rounded to the dtype.
    pub(crate) fn initial(self) -> f32 {
        self.initial
    }

    /// Words a row of `dim` values takes.
    pub(crate) fn words(self, dim: usize) -> usize {
        match self.dtype {
            Dtype::F32 => words_for_dim(dim),
            Dtype::F16 | Dtype::Bf16 => dim.div_ceil(HALVES),
        }
    }

    /// Copies a row out: `out[..] = row`, widened to `f32`. Halves are
    /// copied a chunk at a time into a stack buffer (see
    /// [`bulk`](super::bulk)) and widened there: a bf16 is the top
    /// half of an `f32`, so widening it is a shift the compiler vectorizes.
    #[inline]
    pub(crate) fn load(self, row: &[AtomicU64], out: &mut [f32]) {
        if self.dtype == Dtype::F32 {
            return load_row_xor(row, self.mask, out);
        }
        let mut words = [0u64; CHUNK / HALVES];
        let mut split = [0u16; CHUNK];
        for (row, out) in row.chunks(CHUNK / HALVES).zip(out.chunks_mut(CHUNK)) {
            let words = &mut words[..row.len()];
            load_words(row, bytemuck::cast_slice_mut(words));
            if self.mask != 0 {
                words.iter_mut().for_each(|w| *w ^= self.mask);
            }
            let halves: &[u16] = if cfg!(target_endian = "little") {
                // Value `4i + j` is bits `16j..` of word `i`: on a
                // little-endian machine, half `4i + j` of the words' image.
                bytemuck::cast_slice(words)
            } else {
                for (&w, four) in words.iter().zip(split.chunks_exact_mut(HALVES)) {
                    for (j, b) in four.iter_mut().enumerate() {
                        *b = (w >> (16 * j)) as u16;
                    }
                }
                &split[..HALVES * words.len()]
            };
            // The common prefix, should the lengths disagree.
            let n = out.len().min(halves.len());
            let (halves, out) = (&halves[..n], &mut out[..n]);
            match self.dtype {
                Dtype::F16 => halves.reinterpret_cast::<f16>().convert_to_f32_slice(out),
                _ => {
                    for (o, &h) in out.iter_mut().zip(halves) {
                        *o = f32::from_bits(u32::from(h) << 16);
                    }
                }
            }
        }
    }

    /// [`Codec::store`] of bf16: each value rounded to nearest even by
    /// adding half a unit (less one, plus the kept lowest bit) and cutting
    /// the low 16 bits, as `half::bf16::from_f32` rounds a finite value
    /// (the caller stores no NaN), four values a word.
    #[inline]
    fn store_bf16(self, row: &[AtomicU64], src: &[f32]) {
        let round = |v: f32| {
            let bits = v.to_bits();
            (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
        };
        let mut bits = [0u16; CHUNK];
        for (row, src) in row.chunks(CHUNK / HALVES).zip(src.chunks(CHUNK)) {
            for (b, &v) in bits.iter_mut().zip(src) {
                *b = round(v);
            }
            self.store_chunk(row, &mut bits, src.len());
        }
    }

    /// Stores one chunk of halves, `bits[..used]`, into the words `row`
    /// (at most `CHUNK / HALVES`), the rest of the last word padded with
    /// the encoded initial value, packed in a stack buffer first.
    #[inline]
    fn store_chunk(self, row: &[AtomicU64], bits: &mut [u16; CHUNK], used: usize) {
        let mut words = [0u64; CHUNK / HALVES];
        bits[used..].fill((self.mask & 0xffff) as u16);
        // The words the values reach (the common prefix, should the lengths
        // disagree).
        let row = &row[..used.div_ceil(HALVES).min(row.len())];
        let words = &mut words[..row.len()];
        if cfg!(target_endian = "little") {
            // Value `4i + j` is bits `16j..` of word `i`: on a little-endian
            // machine, half `4i + j` of the words' image.
            let image: &mut [u16] = bytemuck::cast_slice_mut(words);
            image.copy_from_slice(&bits[..image.len()]);
        } else {
            for (w, four) in words.iter_mut().zip(bits.chunks_exact(HALVES)) {
                *w = four
                    .iter()
                    .enumerate()
                    .fold(0u64, |w, (j, &b)| w | (u64::from(b) << (16 * j)));
            }
        }
        if self.mask != 0 {
            words.iter_mut().for_each(|w| *w ^= self.mask);
        }
        store_words(row, bytemuck::cast_slice(words));
    }

    /// Overwrites a row: `row = src`, rounded to nearest even. Every value
    /// must [fit](Dtype::fits) (the caller checks). The caller holds the
    /// row's write lock.
    #[inline]
    pub(crate) fn store(self, row: &[AtomicU64], src: &[f32]) {
        match self.dtype {
            Dtype::F32 if self.mask == 0 => store_row(row, src),
            Dtype::F32 => store_row_xor(row, self.mask, src),
            Dtype::Bf16 => self.store_bf16(row, src),
            Dtype::F16 => self.store_halves(row, src, |_, _| {}),
        }
    }

    /// [`Codec::store`], but a bf16 column rounds stochastically with the
    /// random bits of `noise` (the column, row key and version mixed with
    /// the user's seed): each value rounds up with a probability equal to
    /// its distance from the bf16 value below it, in units of the gap. Other
    /// dtypes round to nearest even.
    #[inline]
    pub(crate) fn store_stochastic(self, row: &[AtomicU64], src: &[f32], noise: u64) {
        if self.dtype != Dtype::Bf16 {
            return self.store(row, src);
        }
        self.store_halves(row, src, |at, bits| {
            for (i, (b, &v)) in bits.iter_mut().zip(&src[at..]).enumerate() {
                *b = stochastic_bf16(v, random_u16(noise, (at + i) as u64)).unwrap_or(*b);
            }
        });
    }

    /// Stores `src` as halves, chunk by chunk: each chunk is rounded to
    /// nearest even, then `adjust(first value's index, bits)` may change
    /// its bits.
    #[inline]
    fn store_halves(self, row: &[AtomicU64], src: &[f32], adjust: impl Fn(usize, &mut [u16])) {
        let mut bits = [0u16; CHUNK];
        for (c, (words, src)) in row
            .chunks(CHUNK / HALVES)
            .zip(src.chunks(CHUNK))
            .enumerate()
        {
            let used = &mut bits[..src.len()];
            match self.dtype {
                Dtype::F16 => used
                    .reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(src),
                _ => used
                    .reinterpret_cast_mut::<bf16>()
                    .convert_from_f32_slice(src),
            }
            adjust(c * CHUNK, used);
            self.store_chunk(words, &mut bits, src.len());
        }
    }

    /// `row += x` if every sum is finite and fits the dtype; otherwise the
    /// row is left as it was and the first sum that is not is returned. The
    /// caller holds the row's write lock.
    #[inline]
    pub(crate) fn add_if_fits(self, row: &[AtomicU64], x: &[f32]) -> Result<(), f32> {
        if self.dtype == Dtype::F32 && self.mask == 0 {
            return add_row_if_finite(row, x);
        }
        let mut sums = [0f32; CHUNK];
        // First pass: check every sum; second pass: store them.
        for pass in 0..2 {
            for (words, x) in row.chunks(self.words(CHUNK)).zip(x.chunks(CHUNK)) {
                let sums = &mut sums[..x.len()];
                self.load(words, sums);
                for (s, &xi) in sums.iter_mut().zip(x) {
                    *s += xi;
                }
                if pass == 0 {
                    if let Some(&bad) = sums.iter().find(|&&s| !self.dtype.fits(s)) {
                        return Err(bad);
                    }
                } else {
                    self.store(words, sums);
                }
            }
        }
        Ok(())
    }
}

/// bf16 bits of `value` rounded stochastically with 16 random bits: up by
/// one unit when the 16 bits the cut drops, plus `random`, carry into the
/// kept bits. `None` when that would not be finite (the caller keeps the
/// nearest-even bits) or `value` is not finite.
#[inline]
fn stochastic_bf16(value: f32, random: u16) -> Option<u16> {
    if !value.is_finite() {
        return None;
    }
    let bits = value.to_bits();
    let rounded = (bits.checked_add(u32::from(random))? >> 16) as u16;
    // An exponent of all ones: rounding up reached an infinity.
    (rounded & 0x7f80 != 0x7f80).then_some(rounded)
}

/// 16 random bits for value `index` of a row, from `noise` (a counter-based
/// generator: the same arguments give the same bits).
#[inline]
fn random_u16(noise: u64, index: u64) -> u16 {
    let word = mix(noise ^ (index / 4).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (word >> (16 * (index % 4))) as u16
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn column(words: usize) -> Vec<AtomicU64> {
        (0..words).map(|_| AtomicU64::new(0)).collect()
    }

    /// Halves of mismatched lengths copy the common prefix, as the kernels
    /// do, without a panic.
    #[test]
    fn mismatched_halves_use_the_common_prefix() {
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let codec = Codec::new(dtype, 0.0);
            let row = column(1);
            codec.store(&row, &[1.0, 2.0, 3.0, 4.0, 5.0]);
            let mut out = [9.0f32; 6];
            codec.load(&row, &mut out);
            assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 9.0, 9.0], "{dtype}");
            let long = column(20);
            codec.store(&long, &[1.0]);
            assert!(long[1..].iter().all(|w| w.load(Relaxed) == 0), "{dtype}");
            let mut out = vec![9.0f32; 70];
            codec.load(&row, &mut out);
            assert_eq!(&out[..4], [1.0, 2.0, 3.0, 4.0], "{dtype}");
            assert!(out[4..].iter().all(|&v| v == 9.0), "{dtype}");
        }
    }

    fn round_trip(codec: Codec, src: &[f32]) -> Vec<f32> {
        let row = column(codec.words(src.len()));
        codec.store(&row, src);
        let mut out = vec![f32::NAN; src.len()];
        codec.load(&row, &mut out);
        out
    }

    #[test]
    fn every_dtype_round_trips_its_rounded_values() {
        for dim in [1, 3, 4, 5, 63, 64, 65, 130] {
            let src: Vec<f32> = (0..dim).map(|i| (i as f32 - 7.3) * 0.37).collect();
            for dtype in Dtype::ALL {
                for initial in [0.0, 0.1, -2.5] {
                    let codec = Codec::new(dtype, initial);
                    let expected: Vec<f32> = src.iter().map(|&v| dtype.round(v)).collect();
                    assert_eq!(round_trip(codec, &src), expected, "{dtype} dim {dim}");
                }
            }
        }
    }

    #[test]
    fn zeroed_words_read_as_the_rounded_initial_value() {
        for dtype in Dtype::ALL {
            let codec = Codec::new(dtype, 0.1);
            let row = column(codec.words(7));
            let mut out = [0.0; 7];
            codec.load(&row, &mut out);
            assert_eq!(out, [dtype.round(0.1); 7], "{dtype}");
            // A row set to its initial value is zeroed words again, padding
            // included.
            codec.store(&row, &[0.1; 7]);
            assert!(row.iter().all(|w| w.load(Relaxed) == 0), "{dtype}");
        }
    }

    #[test]
    fn halves_pack_four_to_a_word() {
        let codec = Codec::new(Dtype::F16, 0.0);
        assert_eq!(codec.words(64), 16);
        assert_eq!(codec.words(5), 2);
        let row = column(2);
        codec.store(&row, &[1.0, 2.0, -1.0, 0.5, 65504.0]);
        assert_eq!(
            row[0].load(Relaxed),
            0x3800_bc00_4000_3c00,
            "1, 2, -1, 0.5 as f16, lowest first"
        );
        assert_eq!(row[1].load(Relaxed), 0x7bff);
    }

    #[test]
    fn adding_refuses_sums_that_leave_the_range_and_writes_nothing() {
        for dtype in Dtype::ALL {
            let codec = Codec::new(dtype, 0.0);
            let row = column(codec.words(70));
            let big = if dtype == Dtype::F16 { 60000.0 } else { 3e38 };
            let mut start = vec![1.0; 70];
            start[69] = big;
            codec.store(&row, &start);
            let before: Vec<u64> = row.iter().map(|w| w.load(Relaxed)).collect();
            let mut x = vec![1.0; 70];
            x[69] = if dtype == Dtype::F16 { 6000.0 } else { 3e38 };
            assert!(codec.add_if_fits(&row, &x).is_err(), "{dtype}");
            let after: Vec<u64> = row.iter().map(|w| w.load(Relaxed)).collect();
            assert_eq!(before, after, "{dtype}");
            x[69] = 1.0;
            codec.add_if_fits(&row, &x).unwrap();
            let mut out = vec![0.0; 70];
            codec.load(&row, &mut out);
            assert_eq!(out[0], 2.0);
            assert_eq!(out[69], dtype.round(dtype.round(big) + 1.0));
        }
    }

    #[test]
    fn stochastic_rounding_is_unbiased_and_reproducible() {
        let codec = Codec::new(Dtype::Bf16, 0.0);
        // 1 + 2^-9 lies a quarter of the way from 1 to the next bf16.
        let value = 1.0 + 2f32.powi(-9);
        let n = 4096;
        let src = vec![value; n];
        let row = column(codec.words(n));
        codec.store_stochastic(&row, &src, 42);
        let mut out = vec![0.0; n];
        codec.load(&row, &mut out);
        let up = out.iter().filter(|&&v| v > 1.0).count();
        assert!(out.iter().all(|&v| v == 1.0 || v == 1.0 + 2f32.powi(-7)));
        assert!((900..1150).contains(&up), "{up} of {n} rounded up");
        let mean = out.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!((mean - f64::from(value)).abs() < 2e-4, "{mean}");
        let again = column(codec.words(n));
        codec.store_stochastic(&again, &src, 42);
        let same = row
            .iter()
            .zip(&again)
            .all(|(a, b)| a.load(Relaxed) == b.load(Relaxed));
        assert!(same, "the same noise stores the same bits");
        // Exact values stay exact, and the largest bf16 never becomes
        // infinite.
        let exact = [1.0, -0.5, f32::from_bits(0x7f7f_0000)];
        let row = column(1);
        for noise in 0..64 {
            codec.store_stochastic(&row, &exact, noise);
            let mut out = [0.0; 3];
            codec.load(&row, &mut out);
            assert_eq!(out, exact);
        }
    }
}
