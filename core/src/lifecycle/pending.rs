//! The map one stripe of exact admission counts keeps: pending keys and
//! their counts in one open-addressing array.
//!
//! Linear probing over `(key, count)` entries, a count of 0 marking an
//! empty slot (a pending key's count is at least 1). Removal shifts the
//! entries after the hole back (no tombstones), so a map that admits and
//! counts keys for ever never needs a rehash to clear them, and a lookup
//! of a key the map lacks stops at the first empty slot. The array is a
//! power of two long and at most half full: a lookup reads one or two
//! neighbouring entries, most often in one cache line.

use crate::raw::kernels::prefetch;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// One slot: a key and its count (0: empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    key: u64,
    count: u32,
}

/// Fewest slots a map that holds a key has.
const MIN_SLOTS: usize = 16;

/// Pending keys and their counts (each at least 1).
#[derive(Debug, Default)]
pub(crate) struct PendingMap {
    /// Empty, or a power of two long; at most half of it full.
    entries: Vec<Entry>,
    len: usize,
}

/// Hashes keys to their home slot: fixed seeds (a stripe's map is keyed
/// by the keys themselves, so this hash is part of no format).
const MAP_HASH: ahash::RandomState = ahash::RandomState::with_seeds(
    0x510e_527f_ade6_82d1,
    0x9b05_688c_2b3e_6c1f,
    0x1f83_d9ab_fb41_bd6b,
    0x5be0_cd19_137e_2179,
);

/// Where a map keeps its entries, published by its owner (under the lock
/// that guards the map) for readers that only prefetch: read without the
/// lock, it may be stale, which costs a wasted prefetch and nothing else
/// (a prefetch of any address is harmless).
#[derive(Debug, Default)]
pub(crate) struct ProbeHint {
    entries: AtomicPtr<Entry>,
    mask: AtomicUsize,
}

impl ProbeHint {
    /// Prefetches the home slot of `key` in the entries last published.
    pub(crate) fn prefetch(&self, key: u64) {
        let entries = self.entries.load(Ordering::Relaxed);
        if !entries.is_null() {
            let home = (MAP_HASH.hash_one(key) as usize) & self.mask.load(Ordering::Relaxed);
            // The entry, and the one after it (which a removal reads), most
            // often in the same line.
            prefetch(entries.wrapping_add(home));
            prefetch(entries.wrapping_add(home + 1));
        }
    }
}

/// Where a lookup ended: the key's slot, or the empty slot it would take.
enum Probe {
    Found(usize),
    Vacant(usize),
}

impl PendingMap {
    /// Pending keys held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot mask (the array is a power of two long).
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// The home slot of `key`.
    fn home(&self, key: u64) -> usize {
        (MAP_HASH.hash_one(key) as usize) & self.mask()
    }

    /// Finds `key`, or the empty slot it would take (the array is not
    /// empty and never full, so the probe ends).
    fn probe(&self, key: u64) -> Probe {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let entry = self.entries[i];
            if entry.count == 0 {
                return Probe::Vacant(i);
            }
            if entry.key == key {
                return Probe::Found(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Publishes where the entries are now to `hint`, if they moved.
    pub(crate) fn publish(&self, hint: &ProbeHint) {
        let entries = if self.entries.is_empty() {
            std::ptr::null_mut()
        } else {
            self.entries.as_ptr().cast_mut()
        };
        if hint.entries.load(Ordering::Relaxed) != entries {
            hint.mask
                .store(self.entries.len().saturating_sub(1), Ordering::Relaxed);
            hint.entries.store(entries, Ordering::Relaxed);
        }
    }

    /// The count of `key`, if it is pending.
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        match self.probe(key) {
            Probe::Found(i) => Some(self.entries[i].count),
            Probe::Vacant(_) => None,
        }
    }

    /// Adds one read of `key`: its count, now at least 1, or `None` if the
    /// count reached `remove_at` and the key was removed instead.
    pub(crate) fn bump(&mut self, key: u64, remove_at: u32) -> Option<u32> {
        self.reserve_one();
        match self.probe(key) {
            Probe::Found(i) => {
                let count = self.entries[i].count.saturating_add(1);
                if count >= remove_at {
                    self.remove_at(i);
                    return None;
                }
                self.entries[i].count = count;
                Some(count)
            }
            Probe::Vacant(i) => {
                if remove_at <= 1 {
                    return None;
                }
                self.entries[i] = Entry { key, count: 1 };
                self.len += 1;
                Some(1)
            }
        }
    }

    /// Raises `key`'s count to at least `count` (at least 1), adding the
    /// key if it is not pending.
    pub(crate) fn raise(&mut self, key: u64, count: u32) {
        let count = count.max(1);
        self.reserve_one();
        match self.probe(key) {
            Probe::Found(i) => {
                let entry = &mut self.entries[i].count;
                *entry = (*entry).max(count);
            }
            Probe::Vacant(i) => {
                self.entries[i] = Entry { key, count };
                self.len += 1;
            }
        }
    }

    /// Empties the slot `i` holds, moving back the entries after it that
    /// their probes pass it for, so that no probe crosses a hole.
    fn remove_at(&mut self, i: usize) {
        let mask = self.mask();
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let entry = self.entries[j];
            if entry.count == 0 {
                break;
            }
            // The entry at `j` may fill the hole if its probe passed the
            // hole: its home is no nearer `j` than the hole is.
            let home = self.home(entry.key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.entries[hole] = entry;
                hole = j;
            }
        }
        self.entries[hole] = Entry::default();
        self.len -= 1;
    }

    /// Makes sure one more key keeps the array at most half full.
    fn reserve_one(&mut self) {
        if 2 * (self.len + 1) > self.entries.len() {
            self.rebuild((2 * (self.len + 1)).next_power_of_two().max(MIN_SLOTS));
        }
    }

    /// Moves every entry into an array of `slots` slots.
    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.entries, vec![Entry::default(); slots]);
        self.len = 0;
        for entry in old.into_iter().filter(|e| e.count > 0) {
            if let Probe::Vacant(i) = self.probe(entry.key) {
                self.entries[i] = entry;
                self.len += 1;
            }
        }
    }

    /// Every pending key and its count, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries
            .iter()
            .filter(|e| e.count > 0)
            .map(|e| (e.key, e.count))
    }

    /// Keeps the keys for which `keep(key, count)` is true, in an array
    /// sized for them.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, u32) -> bool) {
        for entry in &mut self.entries {
            if entry.count > 0 && !keep(entry.key, entry.count) {
                *entry = Entry::default();
            }
        }
        let kept = self.entries.iter().filter(|e| e.count > 0).count();
        let slots = if kept == 0 {
            0
        } else {
            (2 * kept).next_power_of_two().max(MIN_SLOTS)
        };
        // The holes this made may cut probes short: put the kept entries
        // again, into a fresh array.
        if slots == 0 {
            self.clear();
        } else {
            self.rebuild(slots);
        }
    }

    /// Forgets every key.
    pub(crate) fn clear(&mut self) {
        self.entries = Vec::new();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// What a map holds, sorted.
    fn contents(map: &PendingMap) -> Vec<(u64, u32)> {
        let mut all: Vec<(u64, u32)> = map.iter().collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn counts_and_removes_at_the_threshold() {
        let mut map = PendingMap::default();
        assert_eq!(map.get(7), None);
        assert_eq!(map.bump(7, 3), Some(1));
        assert_eq!(map.bump(7, 3), Some(2));
        assert_eq!(map.get(7), Some(2));
        assert_eq!(map.bump(7, 3), None);
        assert_eq!((map.get(7), map.len()), (None, 0));
        // A threshold of 1 adds nothing.
        assert_eq!(map.bump(8, 1), None);
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn retaining_nothing_empties_the_map() {
        let mut map = PendingMap::default();
        map.bump(3, 5);
        map.retain(|_, count| count > 1);
        assert_eq!((map.len(), map.get(3), map.iter().count()), (0, None, 0));
        assert_eq!(map.bump(3, 5), Some(1));
    }

    #[test]
    fn removal_keeps_every_colliding_key_reachable() {
        // Six keys with one home slot in a map of MIN_SLOTS slots (which
        // six keys keep), each removed in turn from a map of all six.
        let mut probe = PendingMap::default();
        probe.raise(0, 1);
        assert_eq!(probe.entries.len(), MIN_SLOTS);
        let home = probe.home(0);
        let colliding: Vec<u64> = (0..u64::MAX)
            .filter(|&k| probe.home(k) == home)
            .take(6)
            .collect();
        for &gone in &colliding {
            let mut map = PendingMap::default();
            for (i, &k) in colliding.iter().enumerate() {
                map.raise(k, i as u32 + 1);
            }
            assert_eq!(map.entries.len(), MIN_SLOTS);
            while map.bump(gone, 100).is_some() {}
            for (i, &k) in colliding.iter().enumerate() {
                let expected = (k != gone).then_some(i as u32 + 1);
                assert_eq!(map.get(k), expected, "key {k} after removing {gone}");
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Bump(u64, u32),
        Raise(u64, u32),
        RetainAbove(u32),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so that they collide and come back.
        let key = 0..64_u64;
        prop_oneof![
            8 => (key.clone(), 1..6_u32).prop_map(|(k, n)| Op::Bump(k, n)),
            2 => (key, 1..6_u32).prop_map(|(k, c)| Op::Raise(k, c)),
            1 => (0..4_u32).prop_map(Op::RetainAbove),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The map holds what a `HashMap` following the same rules holds.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut map = PendingMap::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Bump(key, remove_at) => {
                        let count = model.get(&key).copied().unwrap_or(0).saturating_add(1);
                        let expected = if count >= remove_at {
                            model.remove(&key);
                            None
                        } else {
                            model.insert(key, count);
                            Some(count)
                        };
                        prop_assert_eq!(map.bump(key, remove_at), expected);
                    }
                    Op::Raise(key, count) => {
                        let entry = model.entry(key).or_insert(count);
                        *entry = (*entry).max(count);
                        map.raise(key, count);
                    }
                    Op::RetainAbove(floor) => {
                        model.retain(|_, c| *c > floor);
                        map.retain(|_, c| c > floor);
                    }
                    Op::Clear => {
                        model.clear();
                        map.clear();
                    }
                }
                let mut expected: Vec<(u64, u32)> = model.iter().map(|(&k, &c)| (k, c)).collect();
                expected.sort_unstable();
                prop_assert_eq!(contents(&map), expected);
                prop_assert_eq!(map.len(), model.len());
                for key in 0..64 {
                    prop_assert_eq!(map.get(key), model.get(&key).copied());
                }
            }
        }
    }
}
