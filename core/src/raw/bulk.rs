//! Copying into and out of words that other threads may be reading or
//! writing: the copies of a seqlock.
//!
//! A seqlock reader copies a row while a writer may be storing into it, then
//! checks the row's version and retries if it changed; the writer stores
//! while readers may be copying. In the Rust memory model both sides must be
//! atomic accesses, and a loop of Relaxed `AtomicU64` loads or stores is
//! what the compiler must emit one word at a time: it may not merge atomic
//! accesses into vector ones.
//!
//! [`load_words`] and [`store_words`] copy with 16-byte SSE2 loads and
//! stores instead (SSE2 is part of the x86_64 baseline; the VEX encoding
//! when the build enables AVX, so as not to mix encodings), from inline
//! assembly. The language leaves an `asm!` block's memory accesses to the
//! hardware, as long as the block behaves like operations Rust could
//! perform. These blocks are taken to behave like Relaxed atomic loads or
//! stores of the words they cover, in some order, and that rests on one
//! assumption about the hardware: an x86_64 processor reads or writes each
//! 8-byte-aligned half of a 16-byte SSE access whole. Intel and AMD document
//! 16-byte-aligned SSE accesses as single accesses on processors with AVX;
//! for the rest their manuals say only that an access wider than 8 bytes
//! may be carried out as several accesses, and none is known to split an
//! aligned 8-byte part. So a copy racing a write may mix words of two
//! versions, as a loop of word accesses may. Were a word torn all the same,
//! the copy would be one that raced a write, which the caller's seqlock
//! discards.
//!
//! Ordering is the seqlock's, as with word accesses: the blocks declare
//! neither `nomem` nor `readonly`, so the compiler moves no memory access
//! across them; a writer's stores come after the fence that follows its
//! lock's CAS and before its Release of the lock, and a reader's loads sit
//! between its Acquire load of the state and the Acquire fence before its
//! second look. Under Miri and on other architectures both copies are
//! word-by-word loops, so Miri never runs the assembly.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Words copied per assembly block (four 16-byte accesses).
#[cfg(all(target_arch = "x86_64", not(miri)))]
const BLOCK: usize = 8;

/// Copies `src` into the first `8 * src.len()` bytes of `dst` (each word in
/// native byte order), as a seqlock reader may: every word is read as by a
/// Relaxed atomic load, so a copy racing a write may mix words of two
/// versions (module docs). Copies the common prefix if `dst` is shorter.
#[inline]
pub fn load_words(src: &[AtomicU64], dst: &mut [u8]) {
    let words = src.len().min(dst.len() / 8);
    let (src, dst) = (&src[..words], &mut dst[..words * 8]);
    let done = load_vectors(src, dst);
    for (word, bytes) in src[done..].iter().zip(dst[done * 8..].chunks_exact_mut(8)) {
        bytes.copy_from_slice(&word.load(Relaxed).to_ne_bytes());
    }
}

/// Overwrites `dst` with the first `8 * dst.len()` bytes of `src` (each
/// word in native byte order), as a seqlock writer does: every word is
/// written as by a Relaxed atomic store, so a reader copying meanwhile may
/// see words of two versions (module docs). The caller holds the words'
/// write lock.
/// Copies the common prefix if `src` is shorter.
#[inline]
pub fn store_words(dst: &[AtomicU64], src: &[u8]) {
    let words = dst.len().min(src.len() / 8);
    let (dst, src) = (&dst[..words], &src[..words * 8]);
    let done = store_vectors(dst, src);
    for (word, bytes) in dst[done..].iter().zip(src[done * 8..].chunks_exact(8)) {
        let bytes: [u8; 8] = bytes.try_into().expect("chunks of 8 bytes");
        word.store(u64::from_ne_bytes(bytes), Relaxed);
    }
}

/// Copies the leading words of `src` into `dst` (`8 * src.len()` bytes)
/// with 16-byte loads and stores, and returns how many it copied (all but
/// an odd last word).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn load_vectors(src: &[AtomicU64], dst: &mut [u8]) -> usize {
    debug_assert_eq!(dst.len(), src.len() * 8);
    // SAFETY: `src` is valid for reads of `8 * src.len()` bytes, 8-aligned,
    // and other threads access it only atomically; `dst` is valid for
    // writes of as many bytes and aliased by nothing else (it is borrowed
    // mutably, so it cannot overlap the shared `src`).
    unsafe { copy_vectors(src.as_ptr().cast(), dst.as_mut_ptr(), src.len()) }
}

/// Copies the leading words of `src` (`8 * dst.len()` bytes) into `dst`
/// with 16-byte loads and stores, and returns how many it copied (all but
/// an odd last word).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn store_vectors(dst: &[AtomicU64], src: &[u8]) -> usize {
    debug_assert_eq!(src.len(), dst.len() * 8);
    // Writing through a shared reference is what `AtomicU64` (an
    // `UnsafeCell`) permits: its words may be written by any holder.
    let to = dst.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: `src` is valid for reads of `8 * dst.len()` bytes and written
    // by no one while it is borrowed, so it cannot overlap `dst`, whose
    // words are written here; `dst` is valid for writes of as many bytes
    // through `to`, 8-aligned, and other threads access it only atomically.
    unsafe { copy_vectors(src.as_ptr(), to, dst.len()) }
}

/// Copies `words` words (all but an odd last one) from `from` to `to`, 64
/// bytes a block while it can and then 16, and returns how many it copied.
///
/// # Safety
///
/// `from` must be valid for reads and `to` for writes of `8 * words`
/// bytes, at least one of them 8-aligned (the atomic side), the two ranges
/// must not overlap, and any access by another thread to either range must
/// be atomic (the copy then behaves as Relaxed atomic accesses of its
/// words; see the module docs).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn copy_vectors(from: *const u8, to: *mut u8, words: usize) -> usize {
    let mut done = 0;
    while done + 2 <= words {
        // SAFETY: `done * 8` and the bytes past it up to `8 * words` lie in
        // both ranges, which the caller vouches for; `copy_64` reads and
        // writes 64 of them, `copy_16` 16. `movdqu` needs SSE2, part of the
        // x86_64 baseline (its VEX form AVX, which the build then enables),
        // and no alignment.
        unsafe {
            let (from, to) = (from.add(done * 8), to.add(done * 8));
            if done + BLOCK <= words {
                copy_64(from, to);
                done += BLOCK;
            } else {
                copy_16(from, to);
                done += 2;
            }
        }
    }
    done
}

/// The 16-byte unaligned move: VEX-encoded when the build enables AVX, so
/// that the block does not mix SSE and AVX encodings with the code around it.
#[cfg(all(target_arch = "x86_64", not(miri), target_feature = "avx"))]
macro_rules! movdqu {
    () => {
        "vmovdqu"
    };
}
#[cfg(all(target_arch = "x86_64", not(miri), not(target_feature = "avx")))]
macro_rules! movdqu {
    () => {
        "movdqu"
    };
}

/// Copies 64 bytes from `from` to `to` with four 16-byte loads, then four
/// stores.
///
/// # Safety
///
/// `from` must be valid for reads and `to` for writes of 64 bytes, the two
/// ranges must not overlap, and any access by another thread to either range
/// must be atomic (the copy then behaves as Relaxed atomic accesses of its
/// words; see the module docs).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn copy_64(from: *const u8, to: *mut u8) {
    // SAFETY: the caller's contract covers every byte the block touches;
    // the block touches no stack and leaves the flags alone.
    unsafe {
        std::arch::asm!(
            concat!(movdqu!(), " {a}, xmmword ptr [{from}]"),
            concat!(movdqu!(), " {b}, xmmword ptr [{from} + 16]"),
            concat!(movdqu!(), " {c}, xmmword ptr [{from} + 32]"),
            concat!(movdqu!(), " {d}, xmmword ptr [{from} + 48]"),
            concat!(movdqu!(), " xmmword ptr [{to}], {a}"),
            concat!(movdqu!(), " xmmword ptr [{to} + 16], {b}"),
            concat!(movdqu!(), " xmmword ptr [{to} + 32], {c}"),
            concat!(movdqu!(), " xmmword ptr [{to} + 48], {d}"),
            from = in(reg) from,
            to = in(reg) to,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack, preserves_flags),
        );
    }
}

/// Copies 16 bytes from `from` to `to` with one load and one store.
///
/// # Safety
///
/// As for [`copy_64`], for 16 bytes.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn copy_16(from: *const u8, to: *mut u8) {
    // SAFETY: as in `copy_64`.
    unsafe {
        std::arch::asm!(
            concat!(movdqu!(), " {a}, xmmword ptr [{from}]"),
            concat!(movdqu!(), " xmmword ptr [{to}], {a}"),
            from = in(reg) from,
            to = in(reg) to,
            a = out(xmm_reg) _,
            options(nostack, preserves_flags),
        );
    }
}

/// Without vector copies nothing is copied ahead of the word loop.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
#[inline(always)]
fn load_vectors(_src: &[AtomicU64], _dst: &mut [u8]) -> usize {
    0
}

/// Without vector copies nothing is copied ahead of the word loop.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
#[inline(always)]
fn store_vectors(_dst: &[AtomicU64], _src: &[u8]) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths tried: past two 64-byte blocks, a 16-byte step and an odd
    /// word. Miri, which runs the word loops, tries fewer.
    const LENGTHS: usize = if cfg!(miri) { 12 } else { 40 };
    /// Byte offsets tried (the byte side needs no alignment).
    const OFFSETS: usize = if cfg!(miri) { 3 } else { 9 };

    /// `words` distinct words.
    fn words(words: usize) -> Vec<AtomicU64> {
        (0..words as u64)
            .map(|i| AtomicU64::new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5))
            .collect()
    }

    /// The native-order bytes of `words`.
    fn image(words: &[AtomicU64]) -> Vec<u8> {
        words
            .iter()
            .flat_map(|w| w.load(Relaxed).to_ne_bytes())
            .collect()
    }

    /// Every length, at every offset of the byte side (which needs no
    /// alignment), loads exactly the words, and nothing past them.
    #[test]
    fn loads_every_length_at_every_offset() {
        for n in 0..LENGTHS {
            let src = words(n);
            let want = image(&src);
            for offset in 0..OFFSETS {
                let mut dst = vec![0xEEu8; offset + n * 8 + 5];
                load_words(&src, &mut dst[offset..offset + n * 8]);
                assert!(dst[..offset].iter().all(|&b| b == 0xEE));
                assert_eq!(&dst[offset..offset + n * 8], &want[..]);
                assert!(dst[offset + n * 8..].iter().all(|&b| b == 0xEE));
            }
        }
    }

    /// Every length, from every offset of the byte side, stores exactly
    /// the words, and leaves the words past them alone.
    #[test]
    fn stores_every_length_from_every_offset() {
        for n in 0..LENGTHS {
            let want = image(&words(n));
            for offset in 0..OFFSETS {
                let mut src = vec![0xEEu8; offset];
                src.extend_from_slice(&want);
                let dst: Vec<AtomicU64> = (0..n + 3).map(|_| AtomicU64::new(7)).collect();
                store_words(&dst[..n], &src[offset..]);
                assert_eq!(image(&dst[..n]), want);
                assert!(dst[n..].iter().all(|w| w.load(Relaxed) == 7));
            }
        }
    }

    /// A long byte side: only the words' bytes are written or read.
    #[test]
    fn long_byte_sides_copy_only_the_words() {
        let src = words(5);
        let mut dst = [0xEEu8; 8 * 5 + 20];
        load_words(&src, &mut dst);
        assert_eq!(&dst[..40], &image(&src)[..]);
        assert!(dst[40..].iter().all(|&b| b == 0xEE));
        let words: Vec<AtomicU64> = (0..5).map(|_| AtomicU64::new(0)).collect();
        store_words(&words, &dst);
        assert_eq!(image(&words), image(&src));
    }

    /// A short byte side covers the whole words that fit.
    #[test]
    fn short_byte_sides_copy_the_common_prefix() {
        let src: Vec<AtomicU64> = (1..=10u64).map(AtomicU64::new).collect();
        let mut dst = [0u8; 8 * 3 + 7];
        load_words(&src, &mut dst);
        for (i, bytes) in dst[..24].chunks_exact(8).enumerate() {
            assert_eq!(u64::from_ne_bytes(bytes.try_into().unwrap()), i as u64 + 1);
        }
        assert!(dst[24..].iter().all(|&b| b == 0));

        let words: Vec<AtomicU64> = (0..10).map(|_| AtomicU64::new(0)).collect();
        store_words(&words, &dst);
        assert!((0..3).all(|i| words[i].load(Relaxed) == i as u64 + 1));
        assert!(words[3..].iter().all(|w| w.load(Relaxed) == 0));
    }
}
