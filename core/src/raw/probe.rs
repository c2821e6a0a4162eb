//! The index's group probe, exposed so benchmarks can compare the SIMD
//! version the table uses with a byte-by-byte scalar one.
//!
//! A group's sixteen one-byte tags live in two `u64` words (slot `s` is byte
//! `s % 8` of word `s / 8`, little-endian). A key whose hash has the six
//! tag bits `h` may be in the slots whose tag is FULL(h) or FROZEN(h); both
//! functions return those slots as a 16-bit mask (bit `s` = slot `s`).

use super::tags::{self, GroupTags};

/// The tag of a slot that holds a key whose hash has tag bits `hash_bits`
/// (the low six bits are used), for building probe inputs.
pub fn full_tag(hash_bits: u8) -> u8 {
    tags::full(hash_bits & 0x3f)
}

/// Slots of the group whose tags match `hash_bits`, compared sixteen at once
/// with `wide::u8x16` (what lookups use).
#[inline]
pub fn match_simd(group: [u64; 2], hash_bits: u8) -> u16 {
    GroupTags::new(group).match_present(hash_bits & 0x3f).0
}

/// The same mask computed one tag at a time.
#[inline]
pub fn match_scalar(group: [u64; 2], hash_bits: u8) -> u16 {
    GroupTags::new(group)
        .match_present_scalar(hash_bits & 0x3f)
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_scalar_agree_and_find_the_full_slot() {
        let mut group = [0u64; 2];
        for slot in 0..16usize {
            let tag = full_tag(slot as u8 * 3);
            group[slot / 8] |= u64::from(tag) << (8 * (slot % 8));
        }
        for h in 0..64u8 {
            assert_eq!(match_simd(group, h), match_scalar(group, h));
        }
        assert_eq!(match_simd(group, 6), 1 << 2);
        assert_eq!(match_simd(group, 1), 0);
    }
}
