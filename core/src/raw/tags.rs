//! Slot states, and matching the 16 tags of a group at once.
//!
//! Every slot of the index has a one-byte tag. The tag alone says what the
//! slot holds, so every 64-bit key value is legal (no sentinel keys):
//!
//! | tag            | state        | meaning                                                        |
//! |----------------|--------------|----------------------------------------------------------------|
//! | `0x00`         | EMPTY        | never used; ends a probe chain                                 |
//! | `0x01`         | MOVED_EMPTY  | was EMPTY when its index was migrated; still ends a chain      |
//! | `0x02`         | DELETED      | tombstone: its key was removed; never reused in this index     |
//! | `0x03`         | MOVED        | was FULL or DELETED when migrated; the truth is in `next`      |
//! | `0x40 \| h`    | PENDING(h)   | claimed by an inserter that is writing key and row             |
//! | `0x80 \| h`    | FULL(h)      | holds a key whose hash has top six bits `h`                    |
//! | `0xC0 \| h`    | FROZEN(h)    | FULL, and being copied into the next index by one migrator     |
//!
//! Transitions (each by CAS on the tag word): EMPTY → PENDING → FULL →
//! DELETED, FULL → FROZEN → MOVED, EMPTY → MOVED_EMPTY, DELETED → MOVED.
//! A slot never goes back to EMPTY, so within one index the set of EMPTY slots
//! only shrinks: that is what makes "first EMPTY slot on the probe chain" a
//! stable place to insert and "a group with an EMPTY slot" a stable chain end.
//!
//! Tags of a group are kept as two `AtomicU64` words (slot `i` is byte `i % 8`
//! of word `i / 8`, in native byte order) and compared sixteen at a time with
//! `wide::u8x16`.

use wide::u8x16;

pub(crate) const EMPTY: u8 = 0x00;
pub(crate) const MOVED_EMPTY: u8 = 0x01;
pub(crate) const DELETED: u8 = 0x02;
pub(crate) const MOVED: u8 = 0x03;
const PENDING_BIT: u8 = 0x40;
const FULL_BIT: u8 = 0x80;
const FROZEN_BITS: u8 = 0xC0;
const HASH_BITS: u8 = 0x3F;

/// The six hash bits kept in a tag: the top bits of the hash (the low bits
/// pick the group, so the two are independent).
#[inline]
pub(crate) fn h6(hash: u64) -> u8 {
    (hash >> 58) as u8
}

#[inline]
pub(crate) fn pending(h: u8) -> u8 {
    PENDING_BIT | (h & HASH_BITS)
}

#[inline]
pub(crate) fn full(h: u8) -> u8 {
    FULL_BIT | (h & HASH_BITS)
}

#[inline]
pub(crate) fn frozen(h: u8) -> u8 {
    FROZEN_BITS | (h & HASH_BITS)
}

#[inline]
pub(crate) fn is_full(tag: u8) -> bool {
    tag & FROZEN_BITS == FULL_BIT
}

#[inline]
pub(crate) fn is_pending(tag: u8) -> bool {
    tag & FROZEN_BITS == PENDING_BIT
}

/// Hash bits of a PENDING, FULL or FROZEN tag.
#[inline]
pub(crate) fn hash_bits(tag: u8) -> u8 {
    tag & HASH_BITS
}

/// Which slot of a tag word holds `slot % 8`, and the word with that byte set.
#[inline]
pub(crate) fn with_byte(word: u64, byte: usize, tag: u8) -> u64 {
    let mut bytes = word.to_ne_bytes();
    bytes[byte] = tag;
    u64::from_ne_bytes(bytes)
}

/// The tag of byte `byte` of a tag word.
#[inline]
pub(crate) fn byte_of(word: u64, byte: usize) -> u8 {
    word.to_ne_bytes()[byte]
}

/// A set of slots of one group, bit `i` for slot `i`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct SlotMask(pub(crate) u16);

impl SlotMask {
    #[inline]
    pub(crate) fn any(self) -> bool {
        self.0 != 0
    }

    #[inline]
    pub(crate) fn first(self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }
}

impl Iterator for SlotMask {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let first = self.first()?;
        self.0 &= self.0 - 1;
        Some(first)
    }
}

/// A snapshot of the sixteen tags of one group. Each byte was read atomically
/// (the two words are read one after the other, so the snapshot is per word);
/// the protocol only relies on per-slot atomicity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupTags {
    words: [u64; 2],
}

impl GroupTags {
    #[inline]
    pub(crate) fn new(words: [u64; 2]) -> Self {
        GroupTags { words }
    }

    #[inline]
    pub(crate) fn word(self, w: usize) -> u64 {
        self.words[w]
    }

    pub(crate) fn tag(self, slot: usize) -> u8 {
        byte_of(self.words[slot / 8], slot % 8)
    }

    #[inline]
    fn lanes(self) -> u8x16 {
        u8x16::from(bytemuck::cast::<[u64; 2], [u8; 16]>(self.words))
    }

    #[inline]
    fn mask_of(lanes: u8x16) -> SlotMask {
        SlotMask(lanes.move_mask() as u16)
    }

    /// Slots that are FULL(h) or FROZEN(h): where a key with hash bits `h`
    /// may be.
    #[inline]
    pub(crate) fn match_present(self, h: u8) -> SlotMask {
        let lanes = self.lanes() | u8x16::splat(PENDING_BIT);
        Self::mask_of(lanes.cmp_eq(u8x16::splat(frozen(h))))
    }

    /// Slots that are PENDING(h): an insert of a key with hash bits `h` may
    /// be in flight there.
    #[inline]
    pub(crate) fn match_pending(self, h: u8) -> SlotMask {
        Self::mask_of(self.lanes().cmp_eq(u8x16::splat(pending(h))))
    }

    /// FULL slots, whatever their hash bits.
    #[inline]
    pub(crate) fn match_any_full(self) -> SlotMask {
        let lanes = self.lanes() & u8x16::splat(FROZEN_BITS);
        Self::mask_of(lanes.cmp_eq(u8x16::splat(FULL_BIT)))
    }

    /// EMPTY slots: where an insert may claim.
    #[inline]
    pub(crate) fn match_empty(self) -> SlotMask {
        Self::mask_of(self.lanes().cmp_eq(u8x16::splat(EMPTY)))
    }

    /// EMPTY or MOVED_EMPTY slots: a group with one ends the probe chain.
    #[inline]
    pub(crate) fn match_chain_end(self) -> SlotMask {
        let lanes = self.lanes() & u8x16::splat(!MOVED_EMPTY);
        Self::mask_of(lanes.cmp_eq(u8x16::splat(EMPTY)))
    }

    /// Slots a migration has reached (MOVED, MOVED_EMPTY or FROZEN): a writer
    /// that meets one must finish the migration and work in the next index.
    #[inline]
    pub(crate) fn match_migrated(self) -> SlotMask {
        let lanes = self.lanes();
        let moved = (lanes & u8x16::splat(!DELETED)).cmp_eq(u8x16::splat(MOVED_EMPTY));
        let frozen = (lanes & u8x16::splat(FROZEN_BITS)).cmp_eq(u8x16::splat(FROZEN_BITS));
        Self::mask_of(moved | frozen)
    }

    /// Scalar version of [`GroupTags::match_present`], the reference the
    /// SIMD version is tested against and benchmarked with.
    pub(crate) fn match_present_scalar(self, h: u8) -> SlotMask {
        let mut mask = 0u16;
        for slot in 0..16 {
            let tag = self.tag(slot);
            if tag == full(h) || tag == frozen(h) {
                mask |= 1 << slot;
            }
        }
        SlotMask(mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(tags: [u8; 16]) -> GroupTags {
        GroupTags::new(bytemuck::cast(tags))
    }

    #[test]
    fn states_are_distinct_for_every_hash() {
        for h in 0..64u8 {
            let states = [
                EMPTY,
                MOVED_EMPTY,
                DELETED,
                MOVED,
                pending(h),
                full(h),
                frozen(h),
            ];
            for (i, a) in states.iter().enumerate() {
                for b in &states[i + 1..] {
                    assert_ne!(a, b, "h = {h}");
                }
            }
            assert!(is_full(full(h)) && !is_full(frozen(h)) && !is_full(pending(h)));
            assert!(is_pending(pending(h)) && !is_pending(full(h)));
            assert_eq!(hash_bits(frozen(h)), h);
        }
    }

    #[test]
    fn each_matcher_selects_exactly_its_states() {
        let h = 0x2A;
        let other = 0x15;
        let tags = [
            EMPTY,
            MOVED_EMPTY,
            DELETED,
            MOVED,
            pending(h),
            full(h),
            frozen(h),
            pending(other),
            full(other),
            frozen(other),
            full(h),
            EMPTY,
            DELETED,
            frozen(0),
            full(0),
            pending(0),
        ];
        let g = group(tags);
        assert_eq!(g.match_present(h), SlotMask(1 << 5 | 1 << 6 | 1 << 10));
        assert_eq!(g.match_present(h), g.match_present_scalar(h));
        assert_eq!(g.match_pending(h), SlotMask(1 << 4));
        assert_eq!(g.match_empty(), SlotMask(1 << 0 | 1 << 11));
        assert_eq!(
            g.match_any_full(),
            SlotMask(1 << 5 | 1 << 8 | 1 << 10 | 1 << 14)
        );
        assert_eq!(g.match_chain_end(), SlotMask(1 << 0 | 1 << 1 | 1 << 11));
        assert_eq!(
            g.match_migrated(),
            SlotMask(1 << 1 | 1 << 3 | 1 << 6 | 1 << 9 | 1 << 13)
        );
        for (slot, &tag) in tags.iter().enumerate() {
            assert_eq!(g.tag(slot), tag);
        }
    }

    #[test]
    fn simd_and_scalar_probe_agree_on_every_tag_pair() {
        for h in 0..64u8 {
            for t in 0..=255u8 {
                let g = group([t; 16]);
                assert_eq!(g.match_present(h), g.match_present_scalar(h), "h {h} t {t}");
            }
        }
    }

    #[test]
    fn with_byte_changes_one_slot() {
        let word = u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]);
        let changed = with_byte(word, 3, 0xEE);
        assert_eq!(changed.to_ne_bytes(), [1, 2, 3, 0xEE, 5, 6, 7, 8]);
        assert_eq!(byte_of(changed, 3), 0xEE);
    }

    #[test]
    fn slot_mask_iterates_in_order() {
        let slots: Vec<usize> = SlotMask(0b1000_0000_0010_0101).collect();
        assert_eq!(slots, vec![0, 2, 5, 15]);
        assert_eq!(SlotMask(0).first(), None);
    }
}
