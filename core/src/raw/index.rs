//! The lock-free index: open addressing from 64-bit keys to row ids.
//!
//! Slots come in groups of 16. A group's tags are two `AtomicU64` words (see
//! [`tags`](super::tags) for the states); its keys and row ids are `Slot`s
//! beside them. A key's probe chain starts at group `hash & group_mask` and
//! walks the following groups, ending at the first group that has an EMPTY
//! (or MOVED_EMPTY) slot.
//!
//! Invariants, all relied on by the operations below:
//! - a key is in at most one slot of an index whose tag is PENDING, FULL or
//!   FROZEN with that key; an insert claims the *first* EMPTY slot of its chain
//!   by CAS on the whole tag word it examined, so two inserts of one key always
//!   contend on the same word and one of them sees the other;
//! - a slot's key and row id are written only while its tag is PENDING (by the
//!   thread that claimed it) and published by the Release CAS to FULL, so a
//!   reader that Acquire-loads a FULL or FROZEN tag sees them;
//! - a slot never returns to EMPTY, so the EMPTY set only shrinks;
//! - `used` counts reserved slots; inserts reserve before they claim, and a
//!   reservation fails past 7/8 of the capacity, so an EMPTY slot always
//!   remains and every probe ends.
//!
//! Migration to a larger (or tombstone-free) index moves slot by slot: EMPTY →
//! MOVED_EMPTY, DELETED → MOVED, FULL → FROZEN → (copied into `next`) →
//! MOVED. Each group has exactly one migrator (groups are handed out in
//! chunks by `cursor`). Readers treat FROZEN as FULL, and when a key is not
//! found they continue in `next` if it exists. Writers that meet a migrated
//! slot stop, help finish the whole migration, and retry in the new index;
//! inserts made in not-yet-migrated groups are copied by their group's
//! migrator, who waits for a PENDING slot to be published first.
//!
//! Waiting: readers never wait. A writer waits only for a PENDING slot with
//! its own six hash bits (an insert of possibly the same key is being
//! published) and, when it runs into a migration, for the chunks other
//! helpers own to finish.

use super::kernels::prefetch;
use super::sync::{AtomicU64, AtomicUsize, Ordering, Spin};
use super::tags::{self, GroupTags};
use super::zeroed::{try_zeroed_slice, ZeroedSlice};
use crossbeam_epoch::Atomic;
use std::alloc::handle_alloc_error;

pub(crate) use super::tags::GroupTags as FirstGroup;

/// Slots per group.
pub(crate) const GROUP: usize = 16;
/// Smallest index: one group.
pub(crate) const MIN_CAPACITY: usize = GROUP;
/// Groups a migrating thread takes at a time.
const MIGRATION_CHUNK: usize = 64;
/// Set in `used` once the index stops granting reservations (migration began).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// The fixed hash of a key: ahash with constant seeds, so the layout of an
/// index is the same on every run (useful for debugging and benchmarks).
#[inline]
pub(crate) fn hash_key(key: u64) -> u64 {
    const SEEDS: ahash::RandomState = ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    );
    SEEDS.hash_one(key)
}

/// Key and row id of one slot.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Slot {
    key: AtomicU64,
    row: AtomicU64,
}

/// Outcome of [`Index::insert`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Insert {
    /// The key was already present, with this row id.
    Found(u64),
    /// The key was absent and now maps to the given row id.
    Inserted,
    /// The chain runs into migrated slots: finish the migration, retry in `next`.
    Migrating,
    /// No reservation could be had: the index must grow first.
    Full,
}

/// Outcome of [`Index::remove`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Remove {
    /// The key was present with this row id, and is now removed.
    Removed(u64),
    /// The key was not present.
    Absent,
    /// The chain runs into migrated slots: finish the migration, retry in `next`.
    Migrating,
}

/// One open-addressing index (see the module docs).
pub(crate) struct Index {
    tags: ZeroedSlice<[AtomicU64; 2]>,
    slots: ZeroedSlice<Slot>,
    group_mask: usize,
    /// Reserved slots (claims happen within reservations), plus `CLOSED`.
    used: AtomicUsize,
    /// Tombstones made in this index (counted per batch: may lag, never exceeds).
    deleted: AtomicUsize,
    /// The index this one migrates into, once a migration has begun.
    pub(crate) next: Atomic<Index>,
    /// Next group to hand out to a migrating thread.
    cursor: AtomicUsize,
    /// Groups whose migration is complete.
    done: AtomicUsize,
}

impl Index {
    /// An empty index of at least `capacity` slots (rounded up to a power of
    /// two number of groups).
    pub(crate) fn with_capacity(capacity: usize) -> Index {
        Self::try_with_capacity(capacity)
            .unwrap_or_else(|| handle_alloc_error(std::alloc::Layout::new::<[Slot; GROUP]>()))
    }

    /// [`Index::with_capacity`], or `None` if that much memory cannot be had.
    pub(crate) fn try_with_capacity(capacity: usize) -> Option<Index> {
        let groups = capacity
            .max(MIN_CAPACITY)
            .div_ceil(GROUP)
            .checked_next_power_of_two()?;
        Some(Index {
            tags: try_zeroed_slice(groups, 64)?,
            slots: try_zeroed_slice(groups.checked_mul(GROUP)?, 64)?,
            group_mask: groups - 1,
            used: AtomicUsize::new(0),
            deleted: AtomicUsize::new(0),
            next: Atomic::null(),
            cursor: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        })
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        (self.group_mask + 1) * GROUP
    }

    /// Number of groups.
    pub(crate) fn groups(&self) -> usize {
        self.group_mask + 1
    }

    /// Bytes of the index arrays in use: in full once they are filled, but a
    /// large (lazily mapped) array counts at most one 2 MiB page per slot
    /// ever reserved in it, since only claiming a slot writes to the arrays
    /// (probes only read, and a page never written takes no memory). So an
    /// index sized ahead of its keys (a capacity hint) counts what its keys
    /// occupy, not the address space reserved for the rest. A migration
    /// writes every tag of the index it empties, which is then retired.
    pub(crate) fn memory_bytes(&self) -> usize {
        let reserved = self.used.load(Ordering::Relaxed) & !CLOSED;
        self.tags.bytes_in_use(reserved) + self.slots.bytes_in_use(reserved)
    }

    /// Bytes of the arrays of an index of `capacity` slots (saturating).
    pub(crate) fn bytes_for_capacity(capacity: usize) -> usize {
        let groups = capacity
            .max(MIN_CAPACITY)
            .div_ceil(GROUP)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX);
        let per_group = std::mem::size_of::<[AtomicU64; 2]>() + GROUP * std::mem::size_of::<Slot>();
        groups.saturating_mul(per_group)
    }

    /// Reservations stop past this many used slots: the most keys the index
    /// holds before it must grow.
    pub(crate) fn threshold(&self) -> usize {
        self.capacity() - self.capacity() / 8
    }

    /// How many slots one reservation takes (small tables reserve one by one).
    pub(crate) fn reservation_chunk(&self) -> usize {
        (self.capacity() / 64).clamp(1, 32)
    }

    /// Reserves `n` slots for inserts. Fails once the index is closed or past
    /// its threshold; a failed reservation stays counted (the count only has
    /// to be an upper bound).
    pub(crate) fn reserve(&self, n: usize) -> bool {
        let prev = self.used.fetch_add(n, Ordering::Relaxed);
        prev & CLOSED == 0 && prev + n <= self.threshold()
    }

    /// Gives back reservations that were not used.
    pub(crate) fn unreserve(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Records `n` tombstones made in this index.
    pub(crate) fn add_deleted(&self, n: usize) {
        if n > 0 {
            self.deleted.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Records slots filled by a migration into this index.
    pub(crate) fn add_used(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    /// Stops reservations. The first caller gets an upper bound on the number
    /// of keys this index can ever hold from now on (what a migration must
    /// copy); later callers get `None`.
    pub(crate) fn close(&self) -> Option<usize> {
        let prev = self.used.fetch_or(CLOSED, Ordering::AcqRel);
        if prev & CLOSED != 0 {
            return None;
        }
        Some(prev.saturating_sub(self.deleted.load(Ordering::Acquire)))
    }

    /// True once a migration has begun (reservations closed).
    pub(crate) fn is_closed(&self) -> bool {
        self.used.load(Ordering::Acquire) & CLOSED != 0
    }

    #[inline]
    fn first_group(&self, hash: u64) -> usize {
        hash as usize & self.group_mask
    }

    /// Address of a key's first tag group, for prefetching.
    #[inline]
    pub(crate) fn tags_address(&self, hash: u64) -> *const u8 {
        self.tags[self.first_group(hash)].as_ptr().cast()
    }

    /// Prefetches the slots of a key's first group whose tags match its
    /// hash (the tag group is read: it should be in cache or on its way).
    #[inline]
    pub(crate) fn prefetch_slots(&self, hash: u64) {
        let group = self.first_group(hash);
        for slot in self.load_tags(group).match_present(tags::h6(hash)) {
            prefetch(self.slot(group, slot));
        }
    }

    #[inline]
    fn load_tags(&self, group: usize) -> GroupTags {
        let words = &self.tags[group];
        GroupTags::new([
            words[0].load(Ordering::Acquire),
            words[1].load(Ordering::Acquire),
        ])
    }

    #[inline]
    fn tag(&self, group: usize, slot: usize) -> u8 {
        tags::byte_of(self.tags[group][slot / 8].load(Ordering::Acquire), slot % 8)
    }

    #[inline]
    fn slot(&self, group: usize, slot: usize) -> &Slot {
        &self.slots[group * GROUP + slot]
    }

    /// Changes one slot's tag from `from` to `to`, retrying while only other
    /// slots of the word change. Returns the tag found if it was not `from`.
    fn swap_tag(&self, group: usize, slot: usize, from: u8, to: u8) -> Result<(), u8> {
        let word = &self.tags[group][slot / 8];
        let byte = slot % 8;
        let mut current = word.load(Ordering::Acquire);
        loop {
            let tag = tags::byte_of(current, byte);
            if tag != from {
                return Err(tag);
            }
            let wanted = tags::with_byte(current, byte, to);
            match word.compare_exchange_weak(current, wanted, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// Claims the EMPTY `slot` of `group` as PENDING(h), if its tag word is
    /// still what `seen` holds (any change to the word, even in another slot,
    /// fails the claim: see the module docs for why).
    fn claim(&self, group: usize, slot: usize, seen: GroupTags, h: u8) -> bool {
        let word = seen.word(slot / 8);
        let claimed = tags::with_byte(word, slot % 8, tags::pending(h));
        self.tags[group][slot / 8]
            .compare_exchange(word, claimed, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Writes key and row into a slot this thread claimed, runs `publish`,
    /// and makes the slot FULL (Release: readers that see FULL see both).
    fn fill_and_publish(
        &self,
        group: usize,
        slot: usize,
        h: u8,
        key: u64,
        row: u64,
        publish: impl FnOnce(),
    ) {
        let s = self.slot(group, slot);
        s.key.store(key, Ordering::Relaxed);
        s.row.store(row, Ordering::Relaxed);
        publish();
        let published = self.swap_tag(group, slot, tags::pending(h), tags::full(h));
        debug_assert!(published.is_ok(), "only the claimer changes a PENDING slot");
    }

    /// Waits until slot `slot` of `group` is no longer `tag`.
    fn wait_while(&self, group: usize, slot: usize, tag: u8) {
        let spin = Spin::new();
        while self.tag(group, slot) == tag {
            spin.wait();
        }
    }

    /// The row id of `key` in this index, if present here. Takes no lock and
    /// performs no read-modify-write. A `None` is final only if `next` is
    /// null: during a migration the key may already be in `next`.
    #[inline]
    pub(crate) fn find(&self, key: u64, hash: u64) -> Option<u64> {
        let h = tags::h6(hash);
        let mut group = self.first_group(hash);
        for _ in 0..self.groups() {
            let tags = self.load_tags(group);
            for slot in tags.match_present(h) {
                let s = self.slot(group, slot);
                if s.key.load(Ordering::Relaxed) == key {
                    return Some(s.row.load(Ordering::Relaxed));
                }
            }
            if tags.match_chain_end().any() {
                return None;
            }
            group = (group + 1) & self.group_mask;
        }
        None
    }

    /// First stage of a pipelined find: loads the key's first tag group and
    /// prefetches the slots that may hold the key, so that
    /// [`Index::find_finish`] a few keys later finds them in cache. With
    /// `will_claim` it also prefetches the slot an insert would claim (a
    /// claimed slot's stores must land before the insert's publishing CAS).
    #[inline]
    pub(crate) fn find_start(&self, hash: u64, will_claim: bool) -> GroupTags {
        let group = self.first_group(hash);
        let tags = self.load_tags(group);
        for slot in tags.match_present(tags::h6(hash)) {
            prefetch(self.slot(group, slot) as *const Slot);
        }
        if will_claim {
            if let Some(slot) = tags.match_empty().first() {
                prefetch(self.slot(group, slot) as *const Slot);
            }
        }
        tags
    }

    /// Second stage of a pipelined find, from the tags `find_start` loaded:
    /// the answer of [`Index::find`] at the time they were loaded, or a fresh
    /// full probe when the key's chain goes past its first group.
    #[inline]
    pub(crate) fn find_finish(&self, key: u64, hash: u64, first: GroupTags) -> Option<u64> {
        let group = self.first_group(hash);
        for slot in first.match_present(tags::h6(hash)) {
            let s = self.slot(group, slot);
            if s.key.load(Ordering::Relaxed) == key {
                return Some(s.row.load(Ordering::Relaxed));
            }
        }
        if first.match_chain_end().any() {
            return None;
        }
        self.find(key, hash)
    }

    /// Finds `key`, or inserts it mapped to `row`. `publish` runs after the
    /// slot is claimed and before the key becomes visible (the caller marks the
    /// row live there). `budget` holds slots this thread has reserved in this
    /// index; one is consumed by a successful insert.
    pub(crate) fn insert(
        &self,
        key: u64,
        hash: u64,
        row: u64,
        budget: &mut usize,
        publish: impl FnOnce(),
    ) -> Insert {
        let h = tags::h6(hash);
        let mut group = self.first_group(hash);
        for _ in 0..self.groups() {
            loop {
                let tags = self.load_tags(group);
                for slot in tags.match_present(h) {
                    let s = self.slot(group, slot);
                    if s.key.load(Ordering::Relaxed) == key {
                        return Insert::Found(s.row.load(Ordering::Relaxed));
                    }
                }
                if tags.match_migrated().any() {
                    return Insert::Migrating;
                }
                if let Some(slot) = tags.match_pending(h).first() {
                    // Possibly the same key being inserted: wait for it.
                    self.wait_while(group, slot, tags::pending(h));
                    continue;
                }
                let Some(slot) = tags.match_empty().first() else {
                    break;
                };
                if *budget == 0 {
                    let chunk = self.reservation_chunk();
                    if !self.reserve(chunk) {
                        return Insert::Full;
                    }
                    *budget = chunk;
                }
                if !self.claim(group, slot, tags, h) {
                    // The word changed under us: look at the group again.
                    continue;
                }
                *budget -= 1;
                self.fill_and_publish(group, slot, h, key, row, publish);
                return Insert::Inserted;
            }
            group = (group + 1) & self.group_mask;
        }
        Insert::Full
    }

    /// Removes `key` if present, returning its row id (the caller retires it).
    pub(crate) fn remove(&self, key: u64, hash: u64) -> Remove {
        self.remove_if_row(key, hash, None)
    }

    /// Removes `key` only if it maps to row id `row` (an eviction or expiry
    /// that chose the row, not whatever row the key has now): `Absent` if
    /// the key is missing or maps to another row.
    pub(crate) fn remove_row(&self, key: u64, hash: u64, row: u64) -> Remove {
        self.remove_if_row(key, hash, Some(row))
    }

    fn remove_if_row(&self, key: u64, hash: u64, only: Option<u64>) -> Remove {
        let h = tags::h6(hash);
        let mut group = self.first_group(hash);
        for _ in 0..self.groups() {
            let tags = self.load_tags(group);
            for slot in tags.match_present(h) {
                let s = self.slot(group, slot);
                if s.key.load(Ordering::Relaxed) != key {
                    continue;
                }
                let row = s.row.load(Ordering::Relaxed);
                if only.is_some_and(|only| only != row) {
                    return Remove::Absent;
                }
                return match self.swap_tag(group, slot, tags::full(h), tags::DELETED) {
                    Ok(()) => Remove::Removed(row),
                    Err(tags::DELETED) => Remove::Absent,
                    Err(_) => Remove::Migrating,
                };
            }
            if tags.match_migrated().any() {
                return Remove::Migrating;
            }
            if tags.match_chain_end().any() {
                return Remove::Absent;
            }
            group = (group + 1) & self.group_mask;
        }
        Remove::Absent
    }

    /// Inserts a key known to be absent, during a migration into this index
    /// (only migrators write here then, each key once).
    fn insert_unique(&self, key: u64, hash: u64, row: u64) {
        let h = tags::h6(hash);
        let mut group = self.first_group(hash);
        loop {
            let tags = self.load_tags(group);
            match tags.match_empty().first() {
                Some(slot) => {
                    if self.claim(group, slot, tags, h) {
                        self.fill_and_publish(group, slot, h, key, row, || {});
                        return;
                    }
                }
                None => group = (group + 1) & self.group_mask,
            }
        }
    }

    /// Migrates one group into `to`. Returns how many keys were copied. Only
    /// one thread migrates a given group.
    pub(crate) fn migrate_group(&self, group: usize, to: &Index) -> usize {
        let mut copied = 0;
        for slot in 0..GROUP {
            loop {
                let tag = self.tag(group, slot);
                let moved = match tag {
                    tags::EMPTY => self.swap_tag(group, slot, tag, tags::MOVED_EMPTY).is_ok(),
                    tags::DELETED => self.swap_tag(group, slot, tag, tags::MOVED).is_ok(),
                    tags::MOVED | tags::MOVED_EMPTY => true,
                    _ if tags::is_pending(tag) => {
                        self.wait_while(group, slot, tag);
                        false
                    }
                    _ if tags::is_full(tag) => {
                        let h = tags::hash_bits(tag);
                        if self.swap_tag(group, slot, tag, tags::frozen(h)).is_err() {
                            continue;
                        }
                        let s = self.slot(group, slot);
                        let key = s.key.load(Ordering::Relaxed);
                        to.insert_unique(key, hash_key(key), s.row.load(Ordering::Relaxed));
                        let done = self.swap_tag(group, slot, tags::frozen(h), tags::MOVED);
                        debug_assert!(done.is_ok(), "only the migrator changes a FROZEN slot");
                        copied += 1;
                        true
                    }
                    // FROZEN by another migrator: not possible with exclusive
                    // chunks, but waiting is the safe answer.
                    _ => {
                        self.wait_while(group, slot, tag);
                        false
                    }
                };
                if moved {
                    break;
                }
            }
        }
        copied
    }

    /// A hint for a migrator a few groups ahead: for the keys now in `group`,
    /// prefetches their first tag group in `to`, or with `claim_slots` loads
    /// those tags (prefetched earlier) and prefetches the slots the keys will
    /// claim. Each copy publishes with a CAS that waits for the claimed slot's
    /// stores, so these misses are better started early. Reads only.
    pub(crate) fn prefetch_migration(&self, group: usize, to: &Index, claim_slots: bool) {
        let tags = self.load_tags(group);
        for slot in tags.match_any_full() {
            let hash = hash_key(self.slot(group, slot).key.load(Ordering::Relaxed));
            if claim_slots {
                to.find_start(hash, true);
            } else {
                prefetch(to.tags_address(hash));
            }
        }
    }

    /// Takes the next chunk of groups to migrate, if any remain.
    pub(crate) fn claim_migration_chunk(&self) -> Option<std::ops::Range<usize>> {
        let start = self.cursor.fetch_add(MIGRATION_CHUNK, Ordering::Relaxed);
        (start < self.groups()).then(|| start..(start + MIGRATION_CHUNK).min(self.groups()))
    }

    /// Records that `n` groups finished migrating.
    pub(crate) fn finish_migration_chunk(&self, n: usize) {
        self.done.fetch_add(n, Ordering::AcqRel);
    }

    /// True once every group has been migrated.
    pub(crate) fn migration_complete(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.groups()
    }

    /// Calls `f(key, row)` for every FULL or FROZEN slot (a racy scan; for
    /// tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn for_each_present(&self, mut f: impl FnMut(u64, u64)) {
        for group in 0..self.groups() {
            let tags = self.load_tags(group);
            for slot in 0..GROUP {
                let tag = tags.tag(slot);
                if tags::is_full(tag) || tag >= tags::frozen(0) {
                    let s = self.slot(group, slot);
                    f(s.key.load(Ordering::Relaxed), s.row.load(Ordering::Relaxed));
                }
            }
        }
    }
}

// SAFETY: a slot is two atomic integers; zero is a valid value.
unsafe impl super::zeroed::Zeroable for Slot {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn insert(index: &Index, key: u64, row: u64) -> Insert {
        let mut budget = 0;
        let outcome = index.insert(key, hash_key(key), row, &mut budget, || {});
        index.unreserve(budget);
        outcome
    }

    #[test]
    fn every_key_value_is_legal() {
        let index = Index::with_capacity(64);
        let keys = [0, 1, u64::MAX, i64::MIN as u64, -2i64 as u64, 42];
        for (row, &key) in keys.iter().enumerate() {
            assert_eq!(index.find(key, hash_key(key)), None);
            assert_eq!(insert(&index, key, row as u64), Insert::Inserted);
            assert_eq!(insert(&index, key, 99), Insert::Found(row as u64));
        }
        for (row, &key) in keys.iter().enumerate() {
            assert_eq!(index.find(key, hash_key(key)), Some(row as u64));
        }
        assert_eq!(index.remove(0, hash_key(0)), Remove::Removed(0));
        assert_eq!(index.remove(0, hash_key(0)), Remove::Absent);
        assert_eq!(index.find(0, hash_key(0)), None);
        assert_eq!(index.find(u64::MAX, hash_key(u64::MAX)), Some(2));
        assert_eq!(
            insert(&index, 0, 7),
            Insert::Inserted,
            "removed keys can come back"
        );
        assert_eq!(index.find(0, hash_key(0)), Some(7));
    }

    #[test]
    fn reservations_stop_at_seven_eighths_and_keep_an_empty_slot() {
        let index = Index::with_capacity(64);
        let mut inserted = 0u64;
        let mut budget = 0;
        loop {
            match index.insert(inserted, hash_key(inserted), inserted, &mut budget, || {}) {
                Insert::Inserted => inserted += 1,
                Insert::Full => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(inserted as usize <= index.capacity() * 7 / 8);
        assert!(
            inserted as usize >= index.capacity() / 2,
            "only {inserted} fit"
        );
        for key in 0..inserted {
            assert_eq!(index.find(key, hash_key(key)), Some(key));
        }
        assert_eq!(index.find(inserted + 1, hash_key(inserted + 1)), None);
    }

    #[test]
    fn migration_moves_every_key_and_redirects_writers() {
        let old = Index::with_capacity(256);
        let mut model = HashMap::new();
        for key in 0..150u64 {
            assert_eq!(insert(&old, key * 7919, key), Insert::Inserted);
            model.insert(key * 7919, key);
        }
        for key in (0..150u64).step_by(3) {
            assert_eq!(
                old.remove(key * 7919, hash_key(key * 7919)),
                Remove::Removed(key)
            );
            model.remove(&(key * 7919));
        }
        let bound = old.close().expect("first close");
        assert!(bound >= model.len());
        assert_eq!(old.close(), None);
        assert!(!old.reserve(1), "a closed index grants nothing");
        let new = Index::with_capacity(bound * 2);
        // Migrate half the groups: readers see every key through old or new.
        let half = old.groups() / 2;
        let copied_first: usize = (0..half).map(|g| old.migrate_group(g, &new)).sum();
        for (&key, &row) in &model {
            let h = hash_key(key);
            assert_eq!(old.find(key, h).or_else(|| new.find(key, h)), Some(row));
        }
        let copied_rest: usize = (half..old.groups())
            .map(|g| old.migrate_group(g, &new))
            .sum();
        assert_eq!(copied_first + copied_rest, model.len());
        for (&key, &row) in &model {
            let h = hash_key(key);
            assert_eq!(old.find(key, h), None, "old holds only moved slots");
            assert_eq!(new.find(key, h), Some(row));
            assert_eq!(insert(&old, key, 0), Insert::Migrating);
            assert_eq!(old.remove(key, h), Remove::Migrating);
        }
        let mut seen = HashMap::new();
        new.for_each_present(|k, r| {
            assert!(seen.insert(k, r).is_none(), "key {k} copied twice");
        });
        assert_eq!(seen, model);
    }

    #[test]
    fn concurrent_inserts_of_one_key_agree_on_one_row() {
        let rounds = if cfg!(miri) { 3 } else { 200 };
        for round in 0..rounds {
            let index = Index::with_capacity(32);
            let shared = &index;
            let rows: Vec<Insert> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..3)
                    .map(|t| s.spawn(move || insert(shared, round, t)))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let inserted = rows.iter().filter(|o| **o == Insert::Inserted).count();
            assert_eq!(inserted, 1, "exactly one insert wins: {rows:?}");
            let winner = index.find(round, hash_key(round)).unwrap();
            for outcome in rows {
                if let Insert::Found(row) = outcome {
                    assert_eq!(row, winner);
                }
            }
        }
    }
}
