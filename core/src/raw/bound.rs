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
//! [`Ranks`](super::rows::Ranks)), 0 for no live row. Each eviction moves
//! a hand that sweeps the row arena round and round (a CLOCK) by a window
//! of [`WINDOW`] row ids, whose ranks (eight per cache line, in order) are
//! offered to a small pool of the lowest-ranked rows seen so far (Redis's
//! eviction pool); the pool's lowest whose rank has not changed since is
//! evicted. A row is thus compared at least once per sweep, and a window
//! holding many old rows hands all of them to the pool, not just its
//! lowest. The choice is approximate: the victim is the lowest of the rows
//! seen recently, not of the whole table. A writer picks up to
//! [`MAX_VICTIMS`] victims at once, no more than its batch has keys left
//! (that many windows, then that many of the pool's lowest, each row once)
//! and evicts them one per insert that needs room,
//! skipping one whose rank changed meanwhile; picking ahead lets it
//! prefetch their rows and index slots together, and the victims it did
//! not come to go back to the pool when its batch ends. The table never
//! holds fewer rows than its permits allow: a victim is evicted only when
//! an insert needs its permit.
//!
//! **Ageing.** With LFU ageing, one sweep in [`AGEING_SWEEPS`] (the last of
//! each run of that many) halves every rank it passes: a sweep takes about
//! `rows / WINDOW` evictions, so ranks halve once per about `rows`
//! evictions (more often where writes pick victims they do not all use), as TinyLFU halves its counters
//! once per ten times its size of reads (with a miss rate of a tenth,
//! about as often). A checkpoint's restore or load that sets the scores it
//! writes (its policy is the variable's) does not age: it compares them as
//! they are, so a restore past the capacity keeps the highest.

use super::rows::RowStore;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Rows an eviction compares.
pub(crate) const WINDOW: u64 = 64;
/// Candidates the pool keeps.
const POOL: usize = 64;
/// Most rows one [`Bound::victims`] picks.
pub(crate) const MAX_VICTIMS: usize = 8;
/// With LFU ageing, one sweep of the arena in this many halves the ranks
/// it passes (see the module docs).
pub(crate) const AGEING_SWEEPS: u64 = 64;

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
/// first. Ranks are as they were when seen; a popped candidate is checked
/// against its row's current rank, so an entry gone stale (the row written,
/// evicted or reused since) is dropped or re-ranked then. A row may hold
/// two entries (seen by two sweeps): the second finds its rank changed.
#[derive(Default)]
struct Pool {
    entries: Vec<(u64, u64)>,
}

impl Pool {
    /// Keeps `candidate` if it is among the lowest [`POOL`].
    #[inline]
    fn offer(&mut self, candidate: (u64, u64)) {
        if self.entries.len() == POOL && candidate.0 >= self.entries[POOL - 1].0 {
            // Most rows a window offers rank at or above a full pool's
            // highest (ties too: a batch's rows share a timestamp): refused
            // at once.
            return;
        }
        self.keep(candidate);
    }

    /// Inserts `candidate` in rank order, dropping the highest entry beyond
    /// [`POOL`].
    #[inline(never)]
    fn keep(&mut self, candidate: (u64, u64)) {
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

    /// Picks up to `want` (at most [`MAX_VICTIMS`]) rows to evict into
    /// `out`, as `(rank, row)`: scans the next `want` windows of the sweep into the pool of
    /// candidates, then takes the pool's lowest-ranked rows whose rank is
    /// still what the pool holds (a row written since goes back with its
    /// new rank). The caller evicts them in order, each only if its rank is
    /// unchanged and it is still live and mapped to its key, and gives back
    /// those it did not come to ([`Bound::put_back`]). Leaves `out` empty
    /// if no window held a live row.
    /// `ages`: whether the scan halves ranks on an ageing sweep (see the
    /// module docs).
    pub(crate) fn victims(
        &self,
        rows: &RowStore,
        ages: bool,
        want: usize,
        out: &mut Vec<(u64, u64)>,
    ) {
        out.clear();
        let end = rows.high_water();
        if end == 0 {
            return;
        }
        // No more windows than the arena holds: they would overlap.
        let want = want
            .clamp(1, MAX_VICTIMS)
            .min(end.div_ceil(WINDOW) as usize);
        let first = self.hand.fetch_add(WINDOW * want as u64, Ordering::Relaxed);
        let mut seen = [(0u64, 0u64); WINDOW as usize * MAX_VICTIMS];
        let mut found = 0;
        for w in 0..want as u64 {
            let hand = first.wrapping_add(w * WINDOW);
            let start = hand % end;
            let stop = (start + WINDOW).min(end);
            let ageing = self.decay && ages && (hand / end) % AGEING_SWEEPS == AGEING_SWEEPS - 1;
            for row in start..stop {
                let rank = rows.rank(row);
                if rank == 0 {
                    continue;
                }
                if ageing {
                    rows.age_rank(row, rank);
                }
                seen[found] = (rank, row);
                found += 1;
            }
        }
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        for &candidate in &seen[..found] {
            pool.offer(candidate);
        }
        while out.len() < want {
            let Some((rank, row)) = pool.pop() else {
                break;
            };
            let now = rows.rank(row);
            if now == rank {
                // The pool may hold a row twice (seen by two sweeps).
                if !out.iter().any(|&(_, picked)| picked == row) {
                    out.push((rank, row));
                }
            } else if now != 0 {
                pool.offer((now, row));
            }
        }
    }

    /// Returns picked victims a batch did not evict to the pool.
    pub(crate) fn put_back(&self, victims: &[(u64, u64)]) {
        if victims.is_empty() {
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        for &candidate in victims {
            pool.offer(candidate);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_the_lowest_ranks_and_pops_them_in_order() {
        let mut pool = Pool::default();
        for row in 0..200u64 {
            // Ranks 199 down to 0, rows alike.
            pool.offer((199 - row, row));
        }
        assert_eq!(pool.entries.len(), POOL);
        let popped: Vec<u64> = std::iter::from_fn(|| pool.pop())
            .map(|(rank, _)| rank)
            .collect();
        assert_eq!(popped, (0..POOL as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_full_pool_refuses_a_rank_tied_with_its_highest() {
        let mut pool = Pool::default();
        for row in 0..POOL as u64 {
            pool.offer((5, 100 + row));
        }
        pool.offer((5, 1));
        assert!(
            pool.entries.iter().all(|&(_, row)| row >= 100),
            "a tie is refused"
        );
        pool.offer((4, 1));
        assert_eq!(pool.pop(), Some((4, 1)), "a lower rank is kept");
        assert_eq!(pool.entries.len(), POOL - 1);
    }

    #[test]
    fn permits_come_a_few_at_a_time_then_one_and_never_beyond_capacity() {
        let bound = Bound::new(100, false);
        let mut taken = 0;
        while taken < 100 {
            let n = bound.take();
            assert!(n >= 1, "room left");
            taken += n;
        }
        assert_eq!(taken, 100);
        assert_eq!(bound.take(), 0, "full");
        bound.release(3);
        assert_eq!(bound.occupied(), 97);
        assert_eq!(
            (bound.take(), bound.take(), bound.take(), bound.take()),
            (1, 1, 1, 0)
        );
    }
}
