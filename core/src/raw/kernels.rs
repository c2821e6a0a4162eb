//! Vectorized row kernels: the inner loops of lookup, upsert, accumulate and
//! optimizer apply.
//!
//! # Row layout
//!
//! A row of `dim` f32 values lives in [`words_for_dim(dim)`](words_for_dim)
//! consecutive `AtomicU64` words of a column arena. Word `i` holds element
//! `2i` in its low 32 bits and element `2i + 1` in its high 32 bits (as
//! [`f32::to_bits`]). For odd `dim` the high half of the last word is padding:
//! kernels always write it as `0` and ignore it on read.
//!
//! # Relaxed atomics only
//!
//! A row may be copied by a reader while a writer updates it under the row's
//! seqlock; the reader then discards the copy and retries. Even so, a plain
//! (non-atomic) read racing a write is undefined behaviour in the Rust memory
//! model, so every access to row memory here is atomic: rows are copied in
//! and out ([`load_row`], [`store_row`] and their XOR-encoded forms) with the
//! vector copies of `bulk`, which behave as Relaxed atomic word accesses
//! (the compiler may not merge atomic accesses into vector ones itself), and
//! the read-modify-write kernels ([`axpy_row`], [`add_row_if_finite`]) load
//! and store words with
//! [`Ordering::Relaxed`](std::sync::atomic::Ordering::Relaxed).
//! Kernels do no fencing and take no lock: the caller's seqlock provides the
//! ordering (and the exclusion that read-modify-write kernels such as
//! [`axpy_row`] rely on).
//!
//! # Arithmetic
//!
//! Arithmetic runs in `wide::f32x8` lanes: four words (eight floats) are
//! loaded into a `[u64; 4]`, reinterpreted as an `f32x8`, computed on and
//! written back as four words, with a scalar tail for the last `dim % 8`
//! elements. Vector and scalar paths do the same IEEE operations (no fused
//! multiply-add), so results do not depend on where an element falls.
//!
//! Slices of mismatched length are a caller bug: kernels `debug_assert!` the
//! lengths and otherwise process the common prefix without panicking.

use super::bulk::{load_words, store_words};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use wide::{f32x8, i32x8, CmpEq};

/// Floats per SIMD block.
const LANES: usize = 8;
/// Row words per SIMD block (two floats per word).
const BLOCK_WORDS: usize = LANES / 2;
/// Words an XOR-encoded row is staged through, on the stack, at a time.
const STAGED_WORDS: usize = 32;
/// Cache-line size assumed by [`prefetch_span`].
const CACHE_LINE: usize = 64;

/// Number of `AtomicU64` words that hold a row of `dim` f32 values.
#[inline]
pub const fn words_for_dim(dim: usize) -> usize {
    dim.div_ceil(2)
}

/// Splits a row word into its (low, high) elements.
#[inline(always)]
fn unpack(word: u64) -> (f32, f32) {
    (
        f32::from_bits(word as u32),
        f32::from_bits((word >> 32) as u32),
    )
}

/// Packs two elements into a row word, `lo` in the low half.
#[inline(always)]
fn pack(lo: f32, hi: f32) -> u64 {
    u64::from(lo.to_bits()) | (u64::from(hi.to_bits()) << 32)
}

/// Atomically (Relaxed) loads one block of row words as eight lanes.
#[inline(always)]
fn load_block(words: &[AtomicU64]) -> f32x8 {
    let words: &[AtomicU64; BLOCK_WORDS] = words.try_into().expect("block of 4 words");
    let w: [u64; BLOCK_WORDS] = core::array::from_fn(|i| words[i].load(Relaxed));
    if cfg!(target_endian = "little") {
        // Little-endian: the memory image of [u64; 4] is exactly the lane order.
        bytemuck::cast(w)
    } else {
        f32x8::new(core::array::from_fn(|i| {
            let (lo, hi) = unpack(w[i / 2]);
            if i % 2 == 0 {
                lo
            } else {
                hi
            }
        }))
    }
}

/// Atomically (Relaxed) stores eight lanes into one block of row words.
#[inline(always)]
fn store_block(words: &[AtomicU64], v: f32x8) {
    let words: &[AtomicU64; BLOCK_WORDS] = words.try_into().expect("block of 4 words");
    let w: [u64; BLOCK_WORDS] = if cfg!(target_endian = "little") {
        bytemuck::cast(v)
    } else {
        let a = v.to_array();
        core::array::from_fn(|i| pack(a[2 * i], a[2 * i + 1]))
    };
    for (word, bits) in words.iter().zip(w) {
        word.store(bits, Relaxed);
    }
}

/// Reads eight floats from a slice of exactly eight.
#[inline(always)]
fn lanes(xs: &[f32]) -> f32x8 {
    f32x8::new(xs.try_into().expect("block of 8 floats"))
}

/// The floats a kernel handles of `row`, meant for `len` floats: `len`, or
/// the common prefix if the lengths disagree (a caller bug, asserted in
/// debug builds).
#[inline(always)]
fn common_len(row: &[AtomicU64], len: usize) -> usize {
    debug_assert_eq!(row.len(), words_for_dim(len), "row words vs dim");
    len.min(2 * row.len())
}

/// Splits `row` (meant for `len` floats) for a kernel: whole blocks of
/// `BLOCK_WORDS` words and the tail words, and the element count `n` both
/// cover (the common prefix if the lengths disagree).
#[inline(always)]
fn split_row(row: &[AtomicU64], len: usize) -> (&[AtomicU64], &[AtomicU64], usize) {
    let n = common_len(row, len);
    let (blocks, tail) = row[..words_for_dim(n)].split_at(n / LANES * BLOCK_WORDS);
    (blocks, tail, n)
}

/// Copies a row out of its arena: `out[..] = row`.
///
/// `out.len()` is the row's `dim` and `row.len()` must be
/// `words_for_dim(dim)`. The padding half of an odd row's last word is
/// ignored.
#[inline]
pub fn load_row(row: &[AtomicU64], out: &mut [f32]) {
    let n = common_len(row, out.len());
    let whole = n / 2;
    if cfg!(target_endian = "little") {
        // Little-endian: the memory image of a word is its two floats in order.
        load_words(
            &row[..whole],
            bytemuck::cast_slice_mut(&mut out[..2 * whole]),
        );
    } else {
        for (w, o) in row[..whole].iter().zip(out.chunks_exact_mut(2)) {
            (o[0], o[1]) = unpack(w.load(Relaxed));
        }
    }
    if n % 2 == 1 {
        out[n - 1] = unpack(row[whole].load(Relaxed)).0;
    }
}

/// Overwrites a row: `row = src`.
///
/// `src.len()` is the row's `dim` and `row.len()` must be
/// `words_for_dim(dim)`. For odd `dim` the padding half is written as 0.
#[inline]
pub fn store_row(row: &[AtomicU64], src: &[f32]) {
    let n = common_len(row, src.len());
    let whole = n / 2;
    if cfg!(target_endian = "little") {
        // Little-endian: two floats in order are the memory image of a word.
        store_words(&row[..whole], bytemuck::cast_slice(&src[..2 * whole]));
    } else {
        for (w, s) in row[..whole].iter().zip(src.chunks_exact(2)) {
            w.store(pack(s[0], s[1]), Relaxed);
        }
    }
    if n % 2 == 1 {
        row[whole].store(pack(src[n - 1], 0.0), Relaxed);
    }
}

/// The word mask that XOR-encodes every element of a row with `initial`'s
/// bits (see [`load_row_xor`]).
#[inline]
pub fn xor_mask(initial: f32) -> u64 {
    pack(initial, initial)
}

/// Copies a row stored XOR-encoded with `mask` (from [`xor_mask`]) out of
/// its arena: element `i` is `f32::from_bits(stored_bits ^ initial_bits)`.
///
/// Slot columns are stored this way so that zeroed memory (a fresh segment,
/// a reset row) reads as the slot's initial value, exactly. With a mask of 0
/// this is [`load_row`].
#[inline]
pub fn load_row_xor(row: &[AtomicU64], mask: u64, out: &mut [f32]) {
    if mask == 0 {
        return load_row(row, out);
    }
    let n = common_len(row, out.len());
    let mut words = [0u64; STAGED_WORDS];
    for (row, out) in row[..words_for_dim(n)]
        .chunks(STAGED_WORDS)
        .zip(out[..n].chunks_mut(2 * STAGED_WORDS))
    {
        let words = &mut words[..row.len()];
        load_words(row, bytemuck::cast_slice_mut(words));
        for (&w, o) in words.iter().zip(out.chunks_mut(2)) {
            let (lo, hi) = unpack(w ^ mask);
            o[0] = lo;
            if let Some(h) = o.get_mut(1) {
                *h = hi;
            }
        }
    }
}

/// Overwrites a row stored XOR-encoded with `mask`: the inverse of
/// [`load_row_xor`]. The caller must hold the row's write lock.
#[inline]
pub fn store_row_xor(row: &[AtomicU64], mask: u64, src: &[f32]) {
    if mask == 0 {
        return store_row(row, src);
    }
    let n = common_len(row, src.len());
    let pad = f32::from_bits((mask >> 32) as u32);
    let mut words = [0u64; STAGED_WORDS];
    for (row, src) in row[..words_for_dim(n)]
        .chunks(STAGED_WORDS)
        .zip(src[..n].chunks(2 * STAGED_WORDS))
    {
        let words = &mut words[..row.len()];
        for (w, s) in words.iter_mut().zip(src.chunks(2)) {
            *w = pack(s[0], s.get(1).copied().unwrap_or(pad)) ^ mask;
        }
        store_words(row, bytemuck::cast_slice(words));
    }
}

/// Row read-modify-write driver: `row[i] = f(row[i], x[i])`, with `vf` the
/// same operation on eight lanes. Padding stays 0. The caller must hold the
/// row's write lock: the update is not an atomic read-modify-write.
#[inline(always)]
fn update_row(
    row: &[AtomicU64],
    x: &[f32],
    vf: impl Fn(f32x8, f32x8) -> f32x8,
    f: impl Fn(f32, f32) -> f32,
) {
    let (blocks, word_tail, n) = split_row(row, x.len());
    let xs = x[..n].chunks_exact(LANES);
    let x_tail = xs.remainder();
    for (w, x8) in blocks.chunks_exact(BLOCK_WORDS).zip(xs) {
        store_block(w, vf(load_block(w), lanes(x8)));
    }
    for (w, x2) in word_tail.iter().zip(x_tail.chunks(2)) {
        let (lo, hi) = unpack(w.load(Relaxed));
        let hi = x2.get(1).map_or(0.0, |&xh| f(hi, xh));
        w.store(pack(f(lo, x2[0]), hi), Relaxed);
    }
}

/// Accumulates into a row: `row += a * x` (gradient accumulation and the
/// optimizers' axpy).
///
/// `x.len()` is the row's `dim` and `row.len()` must be `words_for_dim(dim)`.
/// The caller must hold the row's write lock. `a == 1.0` takes a plain-add
/// path (bit-identical result, one multiply fewer per lane).
#[inline]
pub fn axpy_row(row: &[AtomicU64], a: f32, x: &[f32]) {
    if a == 1.0 {
        update_row(row, x, |r, x| r + x, |r, x| r + x);
    } else {
        let av = f32x8::splat(a);
        update_row(row, x, |r, x| r + x * av, |r, x| r + x * a);
    }
}

/// The first non-finite element of `row + x`, computed as [`axpy_row`]
/// with `a == 1.0` computes it, without writing anything: `None` when every
/// sum is finite.
#[inline(always)]
fn first_non_finite_sum(row: &[AtomicU64], x: &[f32]) -> Option<f32> {
    let (blocks, word_tail, n) = split_row(row, x.len());
    let xs = x[..n].chunks_exact(LANES);
    let x_tail = xs.remainder();
    let mut bad = i32x8::splat(0);
    for (w, x8) in blocks.chunks_exact(BLOCK_WORDS).zip(xs) {
        bad |= non_finite_lanes(load_block(w) + lanes(x8));
    }
    let mut tail_bad = false;
    for (w, x2) in word_tail.iter().zip(x_tail.chunks(2)) {
        let (lo, hi) = unpack(w.load(Relaxed));
        let hi = x2.get(1).map_or(0.0, |&xh| hi + xh);
        tail_bad |= !(lo + x2[0]).is_finite() | !hi.is_finite();
    }
    if bad.any() || tail_bad {
        locate_non_finite_sum(row, x)
    } else {
        None
    }
}

/// The slow path of [`first_non_finite_sum`]: which sum it is.
#[cold]
#[inline(never)]
fn locate_non_finite_sum(row: &[AtomicU64], x: &[f32]) -> Option<f32> {
    let (_, _, n) = split_row(row, x.len());
    row.iter()
        .zip(x[..n].chunks(2))
        .flat_map(|(w, x2)| {
            let (lo, hi) = unpack(w.load(Relaxed));
            [Some(lo + x2[0]), x2.get(1).map(|&xh| hi + xh)]
        })
        .flatten()
        .find(|s| !s.is_finite())
}

/// Most blocks [`add_row_if_finite`] computes in one pass (rows of up to
/// 256 values); wider rows take two passes.
const STAGED_BLOCKS: usize = 32;

/// The lanes of `v` that are infinite or NaN (exponent bits all ones), as
/// all-ones lanes: three integer operations, no floating-point latency.
#[inline(always)]
fn non_finite_lanes(v: f32x8) -> i32x8 {
    let exponent = i32x8::splat(0x7f80_0000);
    (bytemuck::cast::<f32x8, i32x8>(v) & exponent).cmp_eq(exponent)
}

/// `row += x` if every sum is finite; otherwise the row is left exactly as
/// it was and the first non-finite sum is returned (the overflow of two
/// finite numbers is infinite). Rows of up to 256 values are read once:
/// the sums are kept aside while they are checked, then stored; wider rows
/// are read twice (checked, then added as [`axpy_row`] adds).
///
/// `x.len()` is the row's `dim` and `row.len()` must be `words_for_dim(dim)`.
/// The caller must hold the row's write lock.
#[inline(always)]
pub fn add_row_if_finite(row: &[AtomicU64], x: &[f32]) -> Result<(), f32> {
    let (blocks, word_tail, n) = split_row(row, x.len());
    let block_count = blocks.len() / BLOCK_WORDS;
    if block_count > STAGED_BLOCKS {
        return match first_non_finite_sum(row, x) {
            None => {
                axpy_row(row, 1.0, x);
                Ok(())
            }
            Some(bad) => Err(bad),
        };
    }
    let xs = x[..n].chunks_exact(LANES);
    let x_tail = xs.remainder();
    let mut bad = i32x8::splat(0);
    let mut sums = [MaybeUninit::<f32x8>::uninit(); STAGED_BLOCKS];
    for ((w, x8), sum) in blocks.chunks_exact(BLOCK_WORDS).zip(xs).zip(&mut sums) {
        let s = load_block(w) + lanes(x8);
        bad |= non_finite_lanes(s);
        sum.write(s);
    }
    let mut tail = [0u64; BLOCK_WORDS];
    let mut tail_bad = false;
    for ((w, x2), word) in word_tail.iter().zip(x_tail.chunks(2)).zip(&mut tail) {
        let (lo, hi) = unpack(w.load(Relaxed));
        let lo = lo + x2[0];
        let hi = x2.get(1).map_or(0.0, |&xh| hi + xh);
        tail_bad |= !lo.is_finite() | !hi.is_finite();
        *word = pack(lo, hi);
    }
    if bad.any() || tail_bad {
        return Err(locate_non_finite_sum(row, x).unwrap_or(f32::NAN));
    }
    for (w, sum) in blocks.chunks_exact(BLOCK_WORDS).zip(&sums[..block_count]) {
        // SAFETY: the first loop wrote `sums[i]` for every block `i` of
        // `blocks`: `split_row` gives `blocks` exactly `n / LANES` blocks and
        // `xs` as many chunks, and `block_count <= STAGED_BLOCKS` (checked
        // above), so its zip stopped at the last block, not at `sums`' end.
        store_block(w, unsafe { sum.assume_init() });
    }
    for (w, &word) in word_tail.iter().zip(&tail) {
        w.store(word, Relaxed);
    }
    Ok(())
}

/// Slice update driver: `dst[i] = f(dst[i], x[i])`, with `vf` the same
/// operation on eight lanes, over the common prefix of `dst` and `x`.
#[inline(always)]
fn update_slice(
    dst: &mut [f32],
    x: &[f32],
    vf: impl Fn(f32x8, f32x8) -> f32x8,
    f: impl Fn(f32, f32) -> f32,
) {
    debug_assert_eq!(dst.len(), x.len(), "slice lengths");
    let n = dst.len().min(x.len());
    let mut ds = dst[..n].chunks_exact_mut(LANES);
    let xs = x[..n].chunks_exact(LANES);
    let x_tail = xs.remainder();
    for (d, x8) in (&mut ds).zip(xs) {
        d.copy_from_slice(&vf(lanes(d), lanes(x8)).to_array());
    }
    for (d, &xi) in ds.into_remainder().iter_mut().zip(x_tail) {
        *d = f(*d, xi);
    }
}

/// `dst += a * x` on plain slices (summing duplicate deltas within a batch).
///
/// Processes `min(dst.len(), x.len())` elements; the lengths should match.
/// `a == 1.0` takes a plain-add path, as in [`axpy_row`].
#[inline]
pub fn axpy(dst: &mut [f32], a: f32, x: &[f32]) {
    if a == 1.0 {
        update_slice(dst, x, |d, x| d + x, |d, x| d + x);
    } else {
        let av = f32x8::splat(a);
        update_slice(dst, x, |d, x| d + x * av, |d, x| d + x * a);
    }
}

/// Scales a slice in place: `dst *= a`.
#[inline]
pub fn scale(dst: &mut [f32], a: f32) {
    let av = f32x8::splat(a);
    let mut ds = dst.chunks_exact_mut(LANES);
    for d in &mut ds {
        d.copy_from_slice(&(lanes(d) * av).to_array());
    }
    for d in ds.into_remainder() {
        *d *= a;
    }
}

/// Index of the first NaN or infinite element of `values`, if any.
///
/// Checks eight lanes at a time and locates the offender from the lane mask.
#[inline]
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    let blocks = values.chunks_exact(LANES);
    let tail = blocks.remainder();
    for (i, b) in blocks.enumerate() {
        let finite = lanes(b).is_finite().move_mask();
        if finite != 0xFF {
            return Some(i * LANES + (!finite).trailing_zeros() as usize);
        }
    }
    let tail_start = values.len() - tail.len();
    tail.iter()
        .position(|v| !v.is_finite())
        .map(|p| tail_start + p)
}

/// Hints the CPU to fetch the cache line containing `ptr` for reading.
///
/// Any address is fine (dangling, null, out of bounds): a prefetch never
/// faults and never dereferences `ptr` in the language sense. A no-op on
/// architectures other than x86_64 and under Miri.
#[inline(always)]
pub fn prefetch<T>(ptr: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `_mm_prefetch` needs SSE, part of the x86_64 baseline. It is
        // only a hint: it never faults, whatever the address (unmapped,
        // dangling or null lines are silently ignored), and does not access
        // memory as far as the Rust abstract machine is concerned.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.cast::<i8>()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = ptr;
}

/// Prefetches every cache line overlapping the `bytes` bytes starting at
/// `ptr` (a row of a wide column spans several lines). Like [`prefetch`],
/// any address is fine.
#[inline]
pub fn prefetch_span<T>(ptr: *const T, bytes: usize) {
    let p = ptr.cast::<u8>();
    let skew = p.addr() % CACHE_LINE;
    let line = p.wrapping_sub(skew);
    for off in (0..bytes.saturating_add(skew)).step_by(CACHE_LINE) {
        prefetch(line.wrapping_add(off));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIMS: [usize; 13] = [1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 256];

    /// Integer-valued test data (exact under +, *, and * 0.5).
    fn ints(dim: usize, seed: i32) -> Vec<f32> {
        (0..dim as i32)
            .map(|i| ((i * 7 + seed) % 23 - 11) as f32)
            .collect()
    }

    /// A fresh row with every word (padding included) set to garbage.
    fn garbage_row(dim: usize) -> Vec<AtomicU64> {
        (0..words_for_dim(dim))
            .map(|_| AtomicU64::new(0xDEAD_BEEF_DEAD_BEEF))
            .collect()
    }

    fn load(row: &[AtomicU64], dim: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; dim];
        load_row(row, &mut out);
        out
    }

    #[test]
    fn words_for_dim_rounds_up() {
        assert_eq!(words_for_dim(0), 0);
        assert_eq!(words_for_dim(1), 1);
        assert_eq!(words_for_dim(2), 1);
        assert_eq!(words_for_dim(3), 2);
        assert_eq!(words_for_dim(256), 128);
        assert_eq!(words_for_dim(257), 129);
    }

    #[test]
    fn store_load_round_trip() {
        for dim in DIMS {
            let src: Vec<f32> = (0..dim).map(|i| i as f32 * 0.25 - 3.5).collect();
            let row = garbage_row(dim);
            store_row(&row, &src);
            assert_eq!(load(&row, dim), src, "dim {dim}");
        }
    }

    #[test]
    fn round_trip_preserves_bits() {
        let src = [
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::MIN_POSITIVE / 2.0,
            f32::MAX,
        ];
        for dim in 1..=src.len() {
            let row = garbage_row(dim);
            store_row(&row, &src[..dim]);
            let out = load(&row, dim);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&src[..dim]), "dim {dim}");
        }
    }

    #[test]
    fn word_layout_low_half_first() {
        let row = garbage_row(3);
        store_row(&row, &[1.0, 2.0, 3.0]);
        let w0 = row[0].load(Relaxed);
        assert_eq!(w0 as u32, 1.0f32.to_bits());
        assert_eq!((w0 >> 32) as u32, 2.0f32.to_bits());
        assert_eq!(row[1].load(Relaxed), u64::from(3.0f32.to_bits()));
    }

    #[test]
    fn padding_is_zero_after_store() {
        for dim in DIMS.into_iter().filter(|d| d % 2 == 1) {
            let row = garbage_row(dim);
            store_row(&row, &ints(dim, 5));
            assert_eq!(row[row.len() - 1].load(Relaxed) >> 32, 0, "dim {dim}");
        }
    }

    #[test]
    fn load_ignores_padding() {
        let row = garbage_row(3);
        store_row(&row, &[1.0, 2.0, 3.0]);
        row[1].store(u64::from(3.0f32.to_bits()) | (0x7FC0_0000 << 32), Relaxed);
        assert_eq!(load(&row, 3), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn xor_rows_read_zeroed_memory_as_the_initial_value() {
        for dim in [1, 2, 7, 8, 9, 33, 65, 130, 256] {
            for initial in [0.0f32, 0.1, -2.5] {
                let mask = xor_mask(initial);
                let row: Vec<AtomicU64> =
                    (0..words_for_dim(dim)).map(|_| AtomicU64::new(0)).collect();
                let mut out = vec![f32::NAN; dim];
                load_row_xor(&row, mask, &mut out);
                assert!(
                    out.iter().all(|v| v.to_bits() == initial.to_bits()),
                    "{dim} {initial}"
                );
                let src = ints(dim, 3);
                store_row_xor(&row, mask, &src);
                load_row_xor(&row, mask, &mut out);
                assert_eq!(out, src);
                store_row_xor(&row, mask, &vec![initial; dim]);
                assert!(
                    row.iter().all(|w| w.load(Relaxed) == 0),
                    "initial is stored as zero"
                );
            }
        }
    }

    #[test]
    fn axpy_row_matches_scalar() {
        for dim in DIMS {
            for a in [1.0, -0.5, 3.0] {
                let base = ints(dim, 3);
                let x = ints(dim, 11);
                let row = garbage_row(dim);
                store_row(&row, &base);
                axpy_row(&row, a, &x);
                let want: Vec<f32> = base.iter().zip(&x).map(|(r, x)| r + a * x).collect();
                assert_eq!(load(&row, dim), want, "dim {dim} a {a}");
                if dim % 2 == 1 {
                    assert_eq!(
                        row[row.len() - 1].load(Relaxed) >> 32,
                        0,
                        "padding dim {dim}"
                    );
                }
            }
        }
    }

    #[test]
    fn add_row_if_finite_adds_or_leaves_the_row_untouched() {
        // Up to 256 values in one pass, wider rows in two.
        for dim in DIMS.into_iter().chain([257, 264, 1001]) {
            let base = ints(dim, 3);
            let x = ints(dim, 11);
            let row = garbage_row(dim);
            store_row(&row, &base);
            assert_eq!(add_row_if_finite(&row, &x), Ok(()), "dim {dim}");
            let want: Vec<f32> = base.iter().zip(&x).map(|(r, x)| r + x).collect();
            assert_eq!(load(&row, dim), want, "dim {dim}");
            // One element overflows (in a block or in the tail): nothing is
            // written, and the overflowed sum is reported.
            for at in [0, dim / 2, dim - 1] {
                let mut big = want.clone();
                big[at] = 3e38;
                store_row(&row, &big);
                let before: Vec<u64> = row.iter().map(|w| w.load(Relaxed)).collect();
                let mut x = ints(dim, 5);
                x[at] = 3e38;
                assert_eq!(
                    add_row_if_finite(&row, &x),
                    Err(f32::INFINITY),
                    "dim {dim} at {at}"
                );
                let after: Vec<u64> = row.iter().map(|w| w.load(Relaxed)).collect();
                assert_eq!(before, after, "dim {dim} at {at}: the row changed");
                x[at] = -3e38;
                big[at] = -3e38;
                store_row(&row, &big);
                assert_eq!(
                    add_row_if_finite(&row, &x),
                    Err(f32::NEG_INFINITY),
                    "dim {dim}"
                );
                assert_eq!(load(&row, dim), big, "dim {dim} at {at}: the row changed");
            }
        }
    }

    #[test]
    fn axpy_matches_scalar() {
        for dim in DIMS {
            for a in [1.0, -0.5, 3.0] {
                let mut dst = ints(dim, 1);
                let x = ints(dim, 9);
                let want: Vec<f32> = dst.iter().zip(&x).map(|(d, x)| d + a * x).collect();
                axpy(&mut dst, a, &x);
                assert_eq!(dst, want, "dim {dim} a {a}");
            }
        }
    }

    #[test]
    fn scale_matches_scalar() {
        for dim in DIMS {
            for a in [0.0, -0.5, 3.0] {
                let mut dst = ints(dim, 4);
                let want: Vec<f32> = dst.iter().map(|d| d * a).collect();
                scale(&mut dst, a);
                assert_eq!(dst, want, "dim {dim} a {a}");
            }
        }
    }

    #[test]
    fn first_non_finite_locates() {
        for len in [1, 7, 8, 9, 15, 16, 17, 20] {
            let mut positions = vec![0, 7, 8, len - 1, len - len % 8];
            positions.retain(|&p| p < len);
            for p in positions {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut v = ints(len, 2);
                    v[p] = bad;
                    assert_eq!(first_non_finite(&v), Some(p), "len {len} pos {p} {bad}");
                    // A later offender does not hide the first one.
                    if p + 1 < len {
                        v[len - 1] = f32::NAN;
                        assert_eq!(first_non_finite(&v), Some(p), "len {len} pos {p} twice");
                    }
                }
            }
        }
    }

    #[test]
    fn first_non_finite_none_for_finite() {
        assert_eq!(first_non_finite(&[]), None);
        let special = [
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE / 4.0,
            -f32::from_bits(1),
            f32::from_bits(1),
            0.0,
            -0.0,
        ];
        for len in [1, 7, 8, 9, 17, 24] {
            let v: Vec<f32> = (0..len).map(|i| special[i % special.len()]).collect();
            assert_eq!(first_non_finite(&v), None, "len {len}");
        }
    }

    #[test]
    fn prefetch_never_crashes() {
        let buf = vec![1u64; 64];
        prefetch(buf.as_ptr());
        prefetch(buf.as_ptr().wrapping_add(1000));
        prefetch_span(buf.as_ptr(), 64 * 8);
        prefetch_span(buf.as_ptr().wrapping_add(3), 100);
        prefetch_span(buf.as_ptr(), 0);
        prefetch(core::ptr::NonNull::<u64>::dangling().as_ptr());
        prefetch_span(core::ptr::NonNull::<[u64; 32]>::dangling().as_ptr(), 256);
        prefetch(core::ptr::null::<u8>());
        assert_eq!(buf[0], 1);
    }
}
