//! The map one stripe of exact admission counts keeps: pending keys and
//! their counts in one open-addressing array.
//!
//! Linear probing over `(key, count)` entries, a count of 0 marking an
//! empty slot (a pending key's count is at least 1). Removal shifts the
//! entries after the hole back (no tombstones), so a map that admits and
//! counts keys for ever never needs a rehash to clear them, and a lookup
//! of a key the map lacks stops at the first empty slot. The array is at
//! most half full (about 1.5 entries read by a lookup that finds its key,
//! 2.5 by one that does not), and 16 bytes an entry: it doubles as keys
//! arrive, up to twice the map's limit (its stripe's share of the bound),
//! so a map at its limit takes 32 bytes a key (for a limit of 8 or more:
//! the array has at least 16 slots). Past its limit (stripes share the
//! bound, so one may hold more than its share) it grows by a quarter at a
//! time, to at most two and a half slots a key; when keys are dropped it
//! is sized for those kept.

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
#[derive(Debug)]
pub(crate) struct PendingMap {
    /// Empty, or at least twice as long as `len`.
    entries: Vec<Entry>,
    len: usize,
    /// Keys the map is sized for: its array grows to at most twice this
    /// while it holds no more (see the module docs).
    limit: usize,
}

/// Hashes keys to their home slot: fixed seeds (a stripe's map is keyed
/// by the keys themselves, so this hash is part of no format).
const MAP_HASH: ahash::RandomState = ahash::RandomState::with_seeds(
    0x510e_527f_ade6_82d1,
    0x9b05_688c_2b3e_6c1f,
    0x1f83_d9ab_fb41_bd6b,
    0x5be0_cd19_137e_2179,
);

/// The home slot of `key` in an array of `slots` slots (the hash's high
/// bits, scaled).
fn home_of(key: u64, slots: usize) -> usize {
    ((u128::from(MAP_HASH.hash_one(key)) * slots as u128) >> 64) as usize
}

/// Where a map keeps its entries, published by its owner (under the lock
/// that guards the map) for readers that only prefetch. Read without the
/// lock, the address and the length may be stale, or one newer than the
/// other; that costs a wasted prefetch and nothing else (a prefetch of any
/// address is harmless). Written only when the array moves, so readers
/// keep it in their caches.
#[derive(Debug, Default)]
pub(crate) struct ProbeHint {
    entries: AtomicPtr<Entry>,
    slots: AtomicUsize,
}

impl ProbeHint {
    /// Prefetches the home slot of `key` and the slot after it (which a
    /// removal reads), in the entries last published.
    pub(crate) fn prefetch(&self, key: u64) {
        let entries = self.entries.load(Ordering::Relaxed);
        let slots = self.slots.load(Ordering::Relaxed);
        if !entries.is_null() && slots > 0 {
            let home = home_of(key, slots);
            prefetch(entries.wrapping_add(home));
            prefetch(entries.wrapping_add(if home + 1 == slots { 0 } else { home + 1 }));
        }
    }
}

/// Where a lookup ended: the key's slot, or the empty slot it would take.
enum Probe {
    Found(usize),
    Vacant(usize),
}

impl PendingMap {
    /// An empty map sized for `limit` keys: up to that many in at most twice as
    /// many slots.
    pub(crate) fn new(limit: usize) -> PendingMap {
        PendingMap {
            entries: Vec::new(),
            len: 0,
            limit,
        }
    }

    /// Pending keys held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot after `i`.
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.entries.len() {
            0
        } else {
            i + 1
        }
    }

    /// How far `to` lies after `from`, going round the array.
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.entries.len() - from
        }
    }

    /// Finds `key`, or the empty slot it would take (the array is not
    /// empty and never full, so the probe ends).
    fn probe(&self, key: u64) -> Probe {
        let mut i = home_of(key, self.entries.len());
        loop {
            let entry = self.entries[i];
            if entry.count == 0 {
                return Probe::Vacant(i);
            }
            if entry.key == key {
                return Probe::Found(i);
            }
            i = self.next(i);
        }
    }

    /// Publishes where the entries are to `hint`, if they moved.
    pub(crate) fn publish(&self, hint: &ProbeHint) {
        let entries = if self.entries.is_empty() {
            std::ptr::null_mut()
        } else {
            self.entries.as_ptr().cast_mut()
        };
        let slots = self.entries.len();
        if hint.entries.load(Ordering::Relaxed) != entries
            || hint.slots.load(Ordering::Relaxed) != slots
        {
            hint.slots.store(slots, Ordering::Relaxed);
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

    /// Finds `key`, allocating the array first if the map has none.
    fn probe_mut(&mut self, key: u64) -> Probe {
        if self.entries.is_empty() {
            self.rebuild(self.slots_for(1));
        }
        self.probe(key)
    }

    /// Adds `key`, which is not in the map and would take slot `at`, with
    /// `count`; the array grows first if one more key would fill it past
    /// half.
    fn insert_new(&mut self, key: u64, count: u32, mut at: usize) {
        if 2 * (self.len + 1) > self.entries.len() {
            let slots = self.slots_for(self.len + 1);
            // Past the limit, by a quarter at a time: rebuilding stays a
            // constant cost per key, and the array little past twice the keys.
            let quarter_more = self.entries.len() + self.entries.len() / 4;
            self.rebuild(slots.max(quarter_more));
            at = match self.probe(key) {
                Probe::Vacant(i) => i,
                Probe::Found(_) => unreachable!("a new key is not in the map"),
            };
        }
        self.entries[at] = Entry { key, count };
        self.len += 1;
    }

    /// Adds one read of `key`: its count, now at least 1, or `None` if the
    /// count reached `remove_at` (at least 2: a key admitted at its first
    /// read is never pending) and the key was removed instead.
    pub(crate) fn bump(&mut self, key: u64, remove_at: u32) -> Option<u32> {
        debug_assert!(remove_at >= 2, "a key admitted at its first read");
        match self.probe_mut(key) {
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
                self.insert_new(key, 1, i);
                Some(1)
            }
        }
    }

    /// Raises `key`'s count to at least `count` (at least 1), adding the
    /// key if it is not pending.
    pub(crate) fn raise(&mut self, key: u64, count: u32) {
        let count = count.max(1);
        match self.probe_mut(key) {
            Probe::Found(i) => {
                let entry = &mut self.entries[i].count;
                *entry = (*entry).max(count);
            }
            Probe::Vacant(i) => self.insert_new(key, count, i),
        }
    }

    /// Empties the slot `i` holds, moving back the entries after it that
    /// their probes pass it for, so that no probe crosses a hole.
    fn remove_at(&mut self, i: usize) {
        let mut hole = i;
        let mut j = i;
        loop {
            j = self.next(j);
            let entry = self.entries[j];
            if entry.count == 0 {
                break;
            }
            // The entry at `j` may fill the hole if its probe passed the
            // hole: its home is no nearer `j` than the hole is.
            let home = home_of(entry.key, self.entries.len());
            if self.distance(home, j) >= self.distance(hole, j) {
                self.entries[hole] = entry;
                hole = j;
            }
        }
        self.entries[hole] = Entry::default();
        self.len -= 1;
    }

    /// Slots for `keys` keys: twice as many, rounded up to a power of two
    /// (at least [`MIN_SLOTS`]) but no more than twice the limit while the
    /// keys are within it, and exactly twice as many past it.
    fn slots_for(&self, keys: usize) -> usize {
        let ceiling = (2 * self.limit).max(MIN_SLOTS);
        if 2 * keys <= ceiling {
            (2 * keys).max(MIN_SLOTS).next_power_of_two().min(ceiling)
        } else {
            2 * keys
        }
    }

    /// Slots the array has (16 bytes each).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    /// Moves every entry into an array of `slots` slots (at least twice
    /// the keys).
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
    /// sized for them ([`slots_for`](Self::slots_for)) if any went.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, u32) -> bool) {
        let mut dropped = 0;
        for entry in &mut self.entries {
            if entry.count > 0 && !keep(entry.key, entry.count) {
                *entry = Entry::default();
                dropped += 1;
            }
        }
        if dropped == 0 {
            return;
        }
        let kept = self.len - dropped;
        if kept == 0 {
            self.clear();
        } else {
            // The holes this made may cut probes short: put the kept
            // entries again.
            self.rebuild(self.slots_for(kept));
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
        let mut map = PendingMap::new(64);
        assert_eq!(map.get(7), None);
        assert_eq!(map.bump(7, 3), Some(1));
        assert_eq!(map.bump(7, 3), Some(2));
        assert_eq!(map.get(7), Some(2));
        assert_eq!(map.bump(7, 3), None);
        assert_eq!((map.get(7), map.len()), (None, 0));
    }

    #[test]
    fn retaining_nothing_empties_the_map() {
        let mut map = PendingMap::new(64);
        map.bump(3, 5);
        map.retain(|_, count| count > 1);
        assert_eq!((map.len(), map.get(3), map.iter().count()), (0, None, 0));
        assert_eq!(map.bump(3, 5), Some(1));
    }

    #[test]
    fn removal_keeps_every_colliding_key_reachable() {
        // Six keys with one home slot in a map of MIN_SLOTS slots (which
        // six keys keep), each removed in turn from a map of all six.
        let home = home_of(0, MIN_SLOTS);
        let colliding: Vec<u64> = (0..u64::MAX)
            .filter(|&k| home_of(k, MIN_SLOTS) == home)
            .take(6)
            .collect();
        for &gone in &colliding {
            let mut map = PendingMap::new(8);
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

    #[test]
    fn a_map_at_its_limit_keeps_its_array() {
        // Keys counted for ever, the lowest dropped at the limit (as a
        // full stripe does): the array stays twice the limit long.
        let limit = 1_000;
        let mut map = PendingMap::new(limit);
        for key in 0..50_000_u64 {
            for key in [key, key / 2] {
                if map.len() >= limit && map.get(key).is_none() {
                    let lowest = map.iter().map(|(_, count)| count).min().unwrap();
                    map.retain(|_, count| count > lowest);
                }
                map.bump(key, 3);
            }
            assert!(map.len() <= limit);
            assert!(
                map.entries.len() <= 2 * limit,
                "{} slots",
                map.entries.len()
            );
            assert!(map.entries.len() >= 2 * map.len());
        }
    }

    #[test]
    fn the_hint_follows_the_array() {
        let hint = ProbeHint::default();
        let mut map = PendingMap::new(1 << 12);
        let published = |hint: &ProbeHint| {
            (
                hint.entries.load(Ordering::Relaxed).cast_const(),
                hint.slots.load(Ordering::Relaxed),
            )
        };
        map.publish(&hint);
        assert_eq!(published(&hint), (std::ptr::null(), 0));
        for key in 0..1_000 {
            map.bump(key, 5);
            map.publish(&hint);
            assert_eq!(published(&hint), (map.entries.as_ptr(), map.entries.len()));
        }
        map.retain(|key, _| key < 10);
        map.publish(&hint);
        assert_eq!(map.entries.len(), 32, "sized for the keys kept");
        assert_eq!(published(&hint), (map.entries.as_ptr(), 32));
        // A prefetch through it reads nothing: any key will do.
        hint.prefetch(u64::MAX);
        map.clear();
        map.publish(&hint);
        assert_eq!(published(&hint), (std::ptr::null(), 0));
        hint.prefetch(7);
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
            8 => (key.clone(), 2..6_u32).prop_map(|(k, n)| Op::Bump(k, n)),
            2 => (key, 1..6_u32).prop_map(|(k, c)| Op::Raise(k, c)),
            1 => (0..4_u32).prop_map(Op::RetainAbove),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The map holds what a `HashMap` following the same rules holds.
        #[test]
        fn behaves_as_a_hash_map(
            limit in 1..48_usize,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let mut map = PendingMap::new(limit);
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
