//! Exact LRU and LFU by write, the references the bounded variable's
//! approximate eviction is held against. Single-threaded, not timed.
//!
//! The model is dynemb's policy with the window widened to the whole
//! table. A batch is processed as the training stream processes it:
//!
//! 1. **Read**, each id in batch order: a present key is a hit (its score
//!    does not move: a read is not a write); an absent key is a miss and is
//!    inserted (its first write: LFU count 1), evicting, when the table is
//!    full, the row with the lowest score, ties broken by the least recent
//!    write.
//! 2. **Write**, each distinct key of the batch once, in first-appearance
//!    order (the optimizer's dedup, then one update per key): LRU sets the
//!    score to the batch's time, LFU adds one to the count.
//!
//! Scores: LRU's is the time of the last write, so the least recently
//! written row goes first; LFU's is the count of writes (an evicted key
//! loses its count: it comes back at 1).
//!
//! One choice the exact model has to make that dynemb's sweep makes
//! structurally: rows read by the batch in flight are not candidates until
//! the batch's write. Without it exact LFU would evict the batch's own new
//! rows first (count 1, below every row that has had its write), and the
//! write would bring them straight back; dynemb's sweep looks at a freshly
//! inserted row last (it sits behind the hand). So no write here ever finds
//! its key gone, and misses equal inserts.
//!
//! Data structure: a map from key to its score and the sequence number of
//! its last write, and per score a queue of `(sequence, key)` in write
//! order (LRU: one queue, scores are times). A write appends to its score's
//! queue and leaves the old entry behind; an eviction pops the front of the
//! lowest score's queue and skips entries that are no longer the key's last
//! write, or whose key the batch in flight has read (that key's write will
//! queue it again). When stale entries outnumber live rows, the queues are
//! rebuilt from the map.

use std::collections::{BTreeMap, VecDeque};

/// Which score an [`ExactCache`] evicts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactPolicy {
    /// Least recently written first.
    Lru,
    /// Least often written first, ties least recently written first.
    Lfu,
}

/// A key's state.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// LFU: writes so far; LRU: 0 (the sequence number orders).
    score: u64,
    /// Sequence number of the key's last write.
    seq: u64,
    /// The last batch that read the key (batches count from 1).
    read_in: u64,
    /// The last batch that wrote the key.
    written_in: u64,
}

/// Exact LRU or LFU by write over a stream of batches (see the module docs).
#[derive(Debug)]
pub struct ExactCache {
    policy: ExactPolicy,
    capacity: usize,
    map: hashbrown::HashMap<u64, Entry, ahash::RandomState>,
    queues: BTreeMap<u64, VecDeque<(u64, u64)>>,
    queued: usize,
    seq: u64,
    batch: u64,
    hits: u64,
    misses: u64,
    evicted: u64,
}

impl ExactCache {
    /// An empty cache of `capacity` rows.
    ///
    /// # Panics
    /// If `capacity` is 0.
    pub fn new(policy: ExactPolicy, capacity: usize) -> ExactCache {
        assert!(capacity > 0, "capacity");
        ExactCache {
            policy,
            capacity,
            map: hashbrown::HashMap::with_capacity_and_hasher(capacity + 1, crate::peers::hasher()),
            queues: BTreeMap::new(),
            queued: 0,
            seq: 0,
            batch: 0,
            hits: 0,
            misses: 0,
            evicted: 0,
        }
    }

    /// Reads then writes one batch of ids.
    ///
    /// # Panics
    /// If the batch holds more distinct ids than the capacity (the rows it
    /// reads could not all stay until its write).
    pub fn batch(&mut self, ids: &[u64]) {
        self.batch += 1;
        let b = self.batch;
        for &id in ids {
            if let Some(e) = self.map.get_mut(&id) {
                e.read_in = b;
                self.hits += 1;
                continue;
            }
            self.misses += 1;
            if self.map.len() == self.capacity {
                self.evict_one();
            }
            self.seq += 1;
            let entry = Entry {
                score: 1,
                seq: self.seq,
                read_in: b,
                written_in: 0,
            };
            self.map.insert(id, entry);
        }
        for &id in ids {
            let e = self
                .map
                .get_mut(&id)
                .expect("a row read in the batch stays");
            if e.written_in == b {
                continue;
            }
            e.written_in = b;
            self.seq += 1;
            e.seq = self.seq;
            e.score = match self.policy {
                ExactPolicy::Lru => 0,
                ExactPolicy::Lfu => e.score + 1,
            };
            self.queues
                .entry(e.score)
                .or_default()
                .push_back((e.seq, id));
            self.queued += 1;
        }
        if self.queued > 2 * self.map.len() + (1 << 16) {
            self.rebuild_queues();
        }
    }

    /// Evicts the lowest-scored row not read by the batch in flight.
    fn evict_one(&mut self) {
        loop {
            let mut lowest = self
                .queues
                .first_entry()
                .expect("the batch reads fewer distinct ids than the capacity");
            let Some((seq, key)) = lowest.get_mut().pop_front() else {
                lowest.remove();
                continue;
            };
            if lowest.get().is_empty() {
                lowest.remove();
            }
            self.queued -= 1;
            match self.map.get(&key) {
                Some(e) if e.seq == seq && e.read_in != self.batch => {
                    self.map.remove(&key);
                    self.evicted += 1;
                    return;
                }
                // A stale entry, or a key the batch in flight read: its
                // write queues it again.
                _ => {}
            }
        }
    }

    /// Rebuilds the queues from the map: one entry per row, in write order.
    fn rebuild_queues(&mut self) {
        let mut live: Vec<(u64, u64, u64)> = self
            .map
            .iter()
            .map(|(&key, e)| (e.score, e.seq, key))
            .collect();
        live.sort_unstable();
        self.queues.clear();
        for (score, seq, key) in live {
            self.queues.entry(score).or_default().push_back((seq, key));
        }
        self.queued = self.map.len();
    }

    /// Reads that found their key.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Reads that did not (each inserted its key).
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Rows evicted.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// `hits / (hits + misses)`.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// Hits, misses and the hit rate of `policy` over `ids` in batches of
/// `batch`, into `capacity` rows.
pub fn simulate(policy: ExactPolicy, ids: &[u64], batch: usize, capacity: usize) -> ExactCache {
    let mut cache = ExactCache::new(policy, capacity);
    for b in ids.chunks(batch.max(1)) {
        cache.batch(b);
    }
    cache
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    /// The same policy by brute force: every eviction scans every row.
    fn brute(policy: ExactPolicy, ids: &[u64], batch: usize, capacity: usize) -> (u64, Vec<u64>) {
        // key -> (score, seq, read_in)
        let mut rows: std::collections::HashMap<u64, (u64, u64, usize)> = Default::default();
        let (mut seq, mut hits) = (0u64, 0u64);
        for (b, ids) in ids.chunks(batch).enumerate() {
            for &id in ids {
                if let Some(r) = rows.get_mut(&id) {
                    r.2 = b;
                    hits += 1;
                    continue;
                }
                if rows.len() == capacity {
                    let victim = rows
                        .iter()
                        .filter(|(_, r)| r.2 != b)
                        .min_by_key(|(_, r)| (r.0, r.1))
                        .map(|(&k, _)| k)
                        .unwrap();
                    rows.remove(&victim);
                }
                seq += 1;
                rows.insert(id, (1, seq, b));
            }
            let mut written = std::collections::HashSet::new();
            for &id in ids {
                if written.insert(id) {
                    let r = rows.get_mut(&id).unwrap();
                    seq += 1;
                    r.1 = seq;
                    r.0 = match policy {
                        ExactPolicy::Lru => 0,
                        ExactPolicy::Lfu => r.0 + 1,
                    };
                }
            }
        }
        let mut kept: Vec<u64> = rows.into_keys().collect();
        kept.sort_unstable();
        (hits, kept)
    }

    #[test]
    fn matches_brute_force() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        for round in 0..40 {
            let universe = rng.random_range(5..60u64);
            let capacity = rng.random_range(8..24usize);
            let batch = rng.random_range(1..8usize);
            // Skewed: half the draws from a few hot keys.
            let ids: Vec<u64> = (0..3000)
                .map(|_| {
                    if rng.random_bool(0.5) {
                        rng.random_range(0..4)
                    } else {
                        rng.random_range(0..universe)
                    }
                })
                .collect();
            for policy in [ExactPolicy::Lru, ExactPolicy::Lfu] {
                let cache = simulate(policy, &ids, batch, capacity);
                let (hits, kept) = brute(policy, &ids, batch, capacity);
                assert_eq!(cache.hits(), hits, "round {round} {policy:?}");
                assert_eq!(cache.hits() + cache.misses(), ids.len() as u64);
                let mut ours: Vec<u64> = cache.map.keys().copied().collect();
                ours.sort_unstable();
                assert_eq!(ours, kept, "round {round} {policy:?}");
                assert_eq!(
                    cache.misses() - cache.evicted(),
                    cache.len() as u64,
                    "every miss inserted"
                );
            }
        }
    }

    #[test]
    fn lru_and_lfu_differ_as_they_should() {
        // Capacity 2, one id per batch: a (twice), b, c.
        let ids = [1, 1, 2, 3, 1];
        let lru = simulate(ExactPolicy::Lru, &ids, 1, 2);
        // LRU: c evicts a (written before b), so the last a misses.
        assert_eq!(lru.hits(), 1);
        assert!(!lru.contains(2) && lru.contains(1) && lru.contains(3));
        let lfu = simulate(ExactPolicy::Lfu, &ids, 1, 2);
        // LFU: a has 3 writes, b 2; c evicts b, and the last a hits.
        assert_eq!(lfu.hits(), 2);
        assert!(lfu.contains(1) && lfu.contains(3));
    }

    #[test]
    fn stale_entries_are_compacted() {
        let ids: Vec<u64> = (0..200_000u64).map(|i| i % 7).collect();
        let cache = simulate(ExactPolicy::Lfu, &ids, 16, 10);
        assert!(cache.queued <= 2 * cache.len() + (1 << 16) + 16);
        assert_eq!(cache.misses(), 7);
    }
}
