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
//! that value. Half-precision values are converted sixteen at a time
//! through fixed stack buffers (f16 with `half`'s conversions), and the
//! words past the last whole block one at a time; rounding is to nearest
//! even except in [`Codec::store_stochastic`]. Rows are copied with
//! [`bulk`](super::bulk)'s vector copies or word atomics, both Relaxed
//! atomic word accesses (or accesses that behave as them); the caller's
//! seqlock orders them.

use super::bulk::{load_words, store_words};
use super::kernels::{
    add_row_if_finite, load_row_xor, store_row, store_row_xor, words_for_dim, xor_mask,
};
use crate::Dtype;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};

/// Values summed per step in [`Codec::add_if_fits`]'s stack buffer.
const CHUNK: usize = 64;
/// Half-precision values per word.
const HALVES: usize = 4;
/// Half-precision values per block of the copies (four words): value
/// `4i + j` is bits `16j..` of word `i`, so on a little-endian machine the
/// block's image is its halves in order.
const BLOCK_HALVES: usize = 16;
/// Words per block of the copies.
const BLOCK_WORDS: usize = BLOCK_HALVES / HALVES;

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
    /// copied a block of [`BLOCK_HALVES`] at a time into a fixed stack
    /// buffer (with [`load_words`]' vector copy) and widened there, which
    /// the compiler vectorizes: a bf16 is the top half of an `f32`, so
    /// widening it is a shift; f16 goes through `half`'s conversion (F16C
    /// where the CPU has it). The words past the last whole block are
    /// copied one at a time.
    #[inline]
    pub(crate) fn load(self, row: &[AtomicU64], out: &mut [f32]) {
        if self.dtype == Dtype::F32 {
            return load_row_xor(row, self.mask, out);
        }
        let blocks = whole_blocks(row, out.len());
        let (head, tail) = out.split_at_mut(blocks * BLOCK_HALVES);
        for (words, out) in row
            .chunks_exact(BLOCK_WORDS)
            .zip(head.chunks_exact_mut(BLOCK_HALVES))
        {
            let mut halves = [0u16; BLOCK_HALVES];
            load_words(words, bytemuck::bytes_of_mut(&mut halves));
            self.unmask(&mut halves);
            self.widen(&halves, out);
        }
        // The common prefix, should the lengths disagree: `zip` stops at
        // the shorter of the words and the groups of four values.
        for (word, four) in row[blocks * BLOCK_WORDS..]
            .iter()
            .zip(tail.chunks_mut(HALVES))
        {
            let word = word.load(Ordering::Relaxed) ^ self.mask;
            let halves: [u16; HALVES] = std::array::from_fn(|j| (word >> (16 * j)) as u16);
            self.widen(&halves[..four.len()], four);
        }
    }

    /// XORs a block's halves with the mask (encoding and decoding are the
    /// same), on the halves themselves: the block is copied in and out
    /// with 16-byte accesses, and working on it in words would make its
    /// vector reads wait for narrower stores.
    #[inline(always)]
    fn unmask(self, halves: &mut [u16; BLOCK_HALVES]) {
        if self.mask != 0 {
            let lane = (self.mask & 0xffff) as u16;
            halves.iter_mut().for_each(|h| *h ^= lane);
        }
    }

    /// `out[..] = halves`, widened to `f32` (equal lengths).
    #[inline(always)]
    fn widen(self, halves: &[u16], out: &mut [f32]) {
        match self.dtype {
            Dtype::F16 => halves.reinterpret_cast::<f16>().convert_to_f32_slice(out),
            _ => {
                for (o, &h) in out.iter_mut().zip(halves) {
                    *o = f32::from_bits(u32::from(h) << 16);
                }
            }
        }
    }

    /// Overwrites a row: `row = src`, rounded to nearest even. Every value
    /// must [fit](Dtype::fits) (the caller checks). The caller holds the
    /// row's write lock.
    #[inline]
    pub(crate) fn store(self, row: &[AtomicU64], src: &[f32]) {
        match self.dtype {
            Dtype::F32 if self.mask == 0 => store_row(row, src),
            Dtype::F32 => store_row_xor(row, self.mask, src),
            Dtype::Bf16 => self.store_halves(row, src, |_, values, bits| {
                for (b, &v) in bits.iter_mut().zip(values) {
                    *b = bf16_nearest_even(v);
                }
            }),
            Dtype::F16 => self.store_halves(row, src, |_, values, bits| {
                bits.reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(values);
            }),
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
        self.store_halves(row, src, |at, values, bits| {
            for (j, (b, &v)) in bits.iter_mut().zip(values).enumerate() {
                let random = random_u16(noise, (at + j) as u64);
                *b = stochastic_bf16(v, random).unwrap_or_else(|| bf16_nearest_even(v));
            }
        });
    }

    /// Stores `src` as halves: `encode(first value's index, values, bits)`
    /// sets `bits` (as many as `values`) to the halves of `values`. Whole
    /// blocks of [`BLOCK_HALVES`] are encoded into a fixed stack buffer and
    /// stored with [`store_words`]' vector copy; the rest a word (four
    /// values) at a time, the rest of a last, partial word padded with the
    /// encoded initial value. Writes only the words the values reach (the
    /// common prefix, should the lengths disagree).
    #[inline]
    fn store_halves(
        self,
        row: &[AtomicU64],
        src: &[f32],
        encode: impl Fn(usize, &[f32], &mut [u16]),
    ) {
        let blocks = whole_blocks(row, src.len());
        let (head, tail) = src.split_at(blocks * BLOCK_HALVES);
        for (b, (words, src)) in row
            .chunks_exact(BLOCK_WORDS)
            .zip(head.chunks_exact(BLOCK_HALVES))
            .enumerate()
        {
            let mut halves = [0u16; BLOCK_HALVES];
            encode(b * BLOCK_HALVES, src, &mut halves);
            self.unmask(&mut halves);
            store_words(words, bytemuck::bytes_of(&halves));
        }
        let words = row[blocks * BLOCK_WORDS..].iter().zip(tail.chunks(HALVES));
        for (i, (word, four)) in words.enumerate() {
            let mut halves = [0u16; HALVES];
            encode(head.len() + i * HALVES, four, &mut halves[..four.len()]);
            let lanes = u64::MAX >> (16 * (HALVES - four.len()));
            let bits = halves
                .iter()
                .enumerate()
                .fold(0, |word, (j, &h)| word | (u64::from(h) << (16 * j)));
            word.store((bits ^ self.mask) & lanes, Ordering::Relaxed);
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

/// Whole blocks of [`BLOCK_HALVES`] values that both `row` and `values`
/// reach, copied through the stack buffers; none on a big-endian
/// machine, where a word's image is not its halves in order.
#[inline]
fn whole_blocks(row: &[AtomicU64], values: usize) -> usize {
    if cfg!(target_endian = "little") {
        (row.len() / BLOCK_WORDS).min(values / BLOCK_HALVES)
    } else {
        0
    }
}

/// bf16 bits of a finite `value` rounded to nearest even: add half a unit
/// (less one, plus the kept lowest bit) and cut the low 16 bits, as
/// `half::bf16::from_f32` rounds a finite value.
#[inline]
fn bf16_nearest_even(value: f32) -> u16 {
    let bits = value.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
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
            // Past a whole block of sixteen: a row one block long keeps the
            // block of a longer source, and a longer row takes the values
            // past the block a word at a time.
            let src: Vec<f32> = (1..=20).map(|v| v as f32).collect();
            let block = column(4);
            codec.store(&block, &src);
            let mut out = vec![9.0f32; 20];
            codec.load(&block, &mut out);
            assert_eq!(out[..16], src[..16], "{dtype}");
            assert!(out[16..].iter().all(|&v| v == 9.0), "{dtype}");
            let longer = column(6);
            codec.store(&longer, &src[..17]);
            assert!(longer[5].load(Relaxed) == 0, "{dtype}");
            let mut out = vec![9.0f32; 24];
            codec.load(&longer, &mut out);
            assert_eq!(out[..17], src[..17], "{dtype}");
            assert!(out[17..20].iter().all(|&v| v == 0.0), "{dtype}: padding");
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
        // A value's noise is its index's, whether it is stored in a whole
        // block or in the words past the last one.
        let short = column(codec.words(19));
        codec.store_stochastic(&short, &src[..19], 42);
        let mut head = [0.0; 19];
        codec.load(&short, &mut head);
        assert_eq!(head, out[..19]);
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
