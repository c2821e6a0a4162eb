//! [`Bound`]: the capacity of a table, and how its eviction picks a victim.
//!
//! **Permits.** `occupied` counts the live keys plus the insert permits
//! writers hold: an insert takes a permit before it claims an index slot,
//! a removal gives one back after its key left the index, and an eviction
//! hands the victim's permit straight to the insert that evicted it. So
//! `occupied` never exceeds the capacity and never falls below the number
//! of live keys, under any interleaving; when no batch is in flight the two
//! are equal. Writers take permits a few at a time below the capacity and
//! one at a time near it, like index reservations.
//!
//! **Victims.** Each row has a rank in a column of its own (see
//! [`Ranks`](super::rows::Ranks)), 0 for no live row. An eviction claims
//! the next window of [`WINDOW`] row ids from a hand that sweeps the row
//! arena round and round (a CLOCK), reads their ranks (eight per cache
//! line, in order), offers them to a small pool of the lowest-ranked rows
//! seen so far (Redis's eviction pool), and evicts the pool's lowest whose
//! rank has not changed since. A row is thus compared at least once per
//! sweep, and a window holding many old rows hands all of them to the
//! pool, not just its lowest. With LFU ageing the sweep halves every rank
//! it passes. The choice is approximate: the victim is the lowest of the
//! rows seen recently, not of the whole table.

use super::rows::RowStore;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Rows an eviction compares.
pub(crate) const WINDOW: u64 = 64;
/// Candidates the pool keeps.
const POOL: usize = 64;
/// Windows an eviction tries before it waits for rows to become live.
const ATTEMPTS: usize = 4;

/// The capacity of one table (see the module docs).
pub(crate) struct Bound {
    capacity: usize,
    occupied: AtomicUsize,
    hand: AtomicU64,
    decay: bool,
    /// The lowest-ranked rows the sweep has seen and not yet evicted.
    pool: Mutex<Pool>,
}

/// Candidates for eviction: up to [`POOL`] `(rank, row)` pairs, lowest rank
/// first, each row once. Ranks are as they were when seen; a popped
/// candidate is checked against its row's current rank.
#[derive(Default)]
struct Pool {
    entries: Vec<(u64, u64)>,
}

impl Pool {
    /// Keeps `candidate` if it is among the lowest [`POOL`] (replacing an
    /// older entry of the same row).
    fn offer(&mut self, candidate: (u64, u64)) {
        if self.entries.len() == POOL && candidate >= self.entries[POOL - 1] {
            // Most rows a window offers rank above a full pool: refused at
            // once. (An older entry of the row, if any, stays: a popped
            // entry is checked against the row's rank anyway.)
            return;
        }
        if let Some(at) = self.entries.iter().position(|&(_, row)| row == candidate.1) {
            self.entries.remove(at);
        }
        let at = self.entries.partition_point(|&entry| entry < candidate);
        self.entries.insert(at, candidate);
        self.entries.truncate(POOL);
    }

    /// The lowest-ranked candidate.
    fn pop(&mut self) -> Option<(u64, u64)> {
        (!self.entries.is_empty()).then(|| self.entries.remove(0))
    }
}

impl Bound {
    /// A bound of `capacity` rows; `decay` halves ranks as the sweep passes.
    pub(crate) fn new(capacity: usize, decay: bool) -> Bound {
        Bound {
            capacity,
            occupied: AtomicUsize::new(0),
            hand: AtomicU64::new(0),
            decay,
            pool: Mutex::new(Pool::default()),
        }
    }

    /// Most rows the table holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Live keys plus permits held (exact when no batch is in flight).
    pub(crate) fn occupied(&self) -> usize {
        self.occupied.load(Ordering::Relaxed)
    }

    /// Slots of the largest index the table uses: twice the capacity, so
    /// that at capacity the index is at most half full of live keys and
    /// has room for the tombstones evictions leave until it is rebuilt.
    pub(crate) fn max_index_slots(&self) -> usize {
        self.capacity.saturating_mul(2)
    }

    /// Takes permits for new keys: a few when there is room, else one;
    /// returns how many it took (0 at capacity).
    pub(crate) fn take(&self) -> usize {
        let chunk = (self.capacity / 64).clamp(1, 16);
        let mut current = self.occupied.load(Ordering::Relaxed);
        loop {
            let room = self.capacity.saturating_sub(current);
            let n = if room >= 2 * chunk {
                chunk
            } else {
                room.min(1)
            };
            if n == 0 {
                return 0;
            }
            match self.occupied.compare_exchange_weak(
                current,
                current + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return n,
                Err(seen) => current = seen,
            }
        }
    }

    /// Gives back `n` permits (unused, or of removed keys).
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            self.occupied.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Evicts one row: scans the next window of the sweep into the pool
    /// of candidates, then evicts the pool's lowest-ranked row whose rank
    /// is still what the pool holds (a row written since goes back with its
    /// new rank). `try_evict(row)` evicts a row, or says it could not (the
    /// row died or changed hands meanwhile). False if a few windows gave
    /// nothing to evict.
    pub(crate) fn evict(&self, rows: &RowStore, mut try_evict: impl FnMut(u64) -> bool) -> bool {
        for _ in 0..ATTEMPTS {
            let end = rows.high_water();
            if end == 0 {
                return false;
            }
            let start = self.hand.fetch_add(WINDOW, Ordering::Relaxed) % end;
            let stop = (start + WINDOW).min(end);
            let mut window = [(0u64, 0u64); WINDOW as usize];
            let mut found = 0;
            for row in start..stop {
                let rank = rows.rank(row);
                if rank == 0 {
                    continue;
                }
                if self.decay {
                    rows.age_rank(row, rank);
                }
                window[found] = (rank, row);
                found += 1;
            }
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            for &candidate in &window[..found] {
                pool.offer(candidate);
            }
            drop(pool);
            // The pool's lock is not held while a row is evicted (that
            // waits for the row's lock, which a writer may hold).
            while let Some(row) = self.next_candidate(rows) {
                if try_evict(row) {
                    return true;
                }
            }
        }
        false
    }

    /// Takes the pool's lowest-ranked candidate whose rank is still what
    /// the pool holds (a dead row is dropped, a row written since goes
    /// back with its new rank).
    fn next_candidate(&self, rows: &RowStore) -> Option<u64> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((rank, row)) = pool.pop() {
            let now = rows.rank(row);
            if now == rank {
                return Some(row);
            }
            if now != 0 {
                pool.offer((now, row));
            }
        }
        None
    }
}
